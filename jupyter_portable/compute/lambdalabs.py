"""Lambda Cloud: whole VMs (Lambda Stack), not containers.

``GET /api/v1/instance-types`` lists each type with the regions that have capacity now
(an empty list means none anywhere); ``POST /api/v1/instance-operations/launch`` starts
one, ``GET /api/v1/instances/{id}`` reads it, ``POST /api/v1/instance-operations/terminate``
ends it. Errors carry a stable ``code``; that is what is matched, never the message.

A launch names exactly one SSH key registered with Lambda. A configured name
(``ssh_key_names`` or ``$LAMBDA_SSH_KEY_NAMES``, comma-separated; the first is sent) wins;
without one, the launch's ``ssh_public_key`` is looked up among the account's keys and, if it
is not registered under any name, registered (``POST /api/v1/ssh-keys``) as
``jupyter-portable-<first 12 hex of its SHA-256>``, and that name is sent. The ``ssh_public_key``
and ``env`` also travel in cloud-init ``user_data``: the key is authorized for ``ubuntu``, the
environment lands in ``/etc/jupyter-portable/env`` (mode 0600) for the worker. There is no
container image: ``image`` is recorded for the worker to run.

The API base is ``base_url``, else ``$LAMBDA_API_URL``, else the real one; the SSH user is
``ssh_user``, else ``$LAMBDA_SSH_USER``, else ``ubuntu`` (Lambda Stack's).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from jupyter_portable.compute.base import (
    ALLOCATION_TAG,
    WORKSPACE_ENV,
    WORKSPACE_TAG,
    Allocation,
    AllocationStatus,
    MachineInfo,
    SshEndpoint,
    machine_name,
    parse_machine_name,
)
from jupyter_portable.compute.cloudinit import cloud_config
from jupyter_portable.compute.config import LAMBDA_API, LAMBDA_SSH_USER, PortableLambda
from jupyter_portable.compute.http import (
    NUMBER,
    ApiClient,
    ErrorInfo,
    HttpProvider,
    ShapeError,
    check_env_names,
    key_from,
    make_offer,
    need,
    opt,
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
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.times import now_iso, utcnow

API = LAMBDA_API
KEY_ENV = "LAMBDA_API_KEY"
SSH_KEYS_ENV = "LAMBDA_SSH_KEY_NAMES"
URL_ENV = "LAMBDA_API_URL"  # a proxy, or a twin in tests
SSH_USER = LAMBDA_SSH_USER  # Lambda Stack images log in as ubuntu, not root
SSH_USER_ENV = "LAMBDA_SSH_USER"
KEY_NAME_PREFIX = "jupyter-portable-"

GPU = re.compile(r"\s*(?P<model>.*?)\s*\(\s*(?P<gb>\d+(?:\.\d+)?)\s*GB\s*(?P<form>[^)]*)\)")

AUTH_CODES = {"global/invalid-api-key", "global/account-inactive", "global/forbidden", "global/invalid-address"}
INSTANCE_STATES = {"booting": "pending", "active": "running", "unhealthy": "running", "terminating": "terminated",
                   "terminated": "terminated", "preempted": "lost"}


def _classify(info: ErrorInfo) -> ComputeError | None:
    """Lambda's ``{"error": {code, message, suggestion?}}`` by ``code``."""
    error = info.body.get("error") if isinstance(info.body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return None
    code: str = error["code"]
    message = error.get("message") if isinstance(error.get("message"), str) else ""
    suggestion = error.get("suggestion") if isinstance(error.get("suggestion"), str) else None
    text = f"lambda refused {info.where} (HTTP {info.status}, {code}): {message}"
    ctx: dict[str, Any] = {"provider": "lambda", "status": info.status, "code": code}
    if code == "instance-operations/launch/insufficient-capacity" or (
            code.startswith("provider/") and "capacity" in code):
        return NoCapacity(text, hint=suggestion, **ctx)
    if code == "global/quota-exceeded" or (code.startswith("provider/") and "quota" in code):
        return QuotaExceeded(text, hint=suggestion, **ctx)
    if code in AUTH_CODES:
        hint = f"check {KEY_ENV}" + (f"; {suggestion}" if suggestion else "")
        return AuthError(text, hint=hint, **ctx)
    if code.startswith("provider/"):
        return ProviderUnavailable(text, hint=suggestion or "try again shortly", **ctx)
    if info.operation == "launch" and info.status < 500:
        return LaunchFailed(text, hint=suggestion, **ctx)
    return None


def gpu_of(description: str) -> tuple[str, float]:
    """``"H100 (80 GB SXM5)"`` -> ``("H100 SXM5", 80.0)``; memory 0.0 when the text does not say."""
    m = GPU.match(description)
    if not m:
        return description.strip() or "unknown", 0.0
    return f"{m['model']} {m['form']}".strip(), float(m["gb"])


class LambdaProvider(HttpProvider):
    """Lambda Cloud instances. ``api_key`` defaults to ``$LAMBDA_API_KEY``; ``ssh_key_names``
    to ``$LAMBDA_SSH_KEY_NAMES`` (none: the launch's key is registered); ``file_system_names``
    are attached at launch."""

    name = "lambda"

    def __init__(self, api_key: str | None = None, *, ssh_key_names: list[str] | tuple[str, ...] | None = None,
                 file_system_names: list[str] | tuple[str, ...] = (), base_url: str | None = None,
                 ssh_user: str | None = None, timeout: float = 30.0,
                 retries: int = 4, backoff: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, transport: httpx.BaseTransport | None = None,
                 now: Callable[[], datetime] = utcnow) -> None:
        self.now = now  # the wall clock spend so far is counted to
        # what is not given comes from the environment or the default (compute.config)
        given = {"ssh_key_names": ssh_key_names, "ssh_user": ssh_user or None, "api_url": base_url or None}
        settings = PortableLambda(**{k: v for k, v in given.items() if v is not None})
        self.ssh_key_names = list(settings.ssh_key_names)
        self.file_system_names = list(file_system_names)
        self.ssh_user = settings.ssh_user
        self._api = ApiClient(provider=self.name, base_url=settings.api_url or API,
                              key=key_from(api_key, KEY_ENV), key_env=KEY_ENV,
                              key_hint="create one at https://cloud.lambda.ai/api-keys", classify=_classify,
                              timeout=timeout, retries=retries, backoff=backoff, sleep=sleep, clock=clock,
                              transport=transport)

    # -- check 1: listed ------------------------------------------------------------------

    def _types(self) -> dict[str, Any]:
        _, body = self._api.request("GET", "/api/v1/instance-types", operation="offers")
        with self._api.reading("GET /api/v1/instance-types"):
            return need(body, "data", dict)

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """One offer per instance type and region with capacity; a type with capacity nowhere
        is still listed once, in region "any", with capacity 0."""
        out = []
        with self._api.reading("GET /api/v1/instance-types"):
            for key, item in self._types().items():
                kind = need(item, "instance_type", dict, where=key)
                name = need(kind, "name", str, where=key)
                gpus = need(need(kind, "specs", dict, where=name), "gpus", int, where=f"{name}.specs")
                if gpus < 1:
                    continue  # CPU-only types
                model, memory = gpu_of(need(kind, "gpu_description", str, where=name))
                price = need(kind, "price_cents_per_hour", NUMBER, where=name) / 100
                regions = [need(r, "name", str, where=f"{name}.regions") for r in
                           need(item, "regions_with_capacity_available", list, where=key)]
                for region in regions or [None]:
                    offer = make_offer(self.name, id=f"{name}@{region or 'any'}", gpu=model, gpu_count=gpus,
                                       gpu_memory_gb=memory, price_per_hour=round(price, 4), region=region or "any",
                                       capacity=1 if region else 0,
                                       extra={"instance_type": name, "region": region})
                    if offer is not None:
                        out.append(offer)
        return out

    # -- check 2: permitted ---------------------------------------------------------------

    def check_permission(self, offer: Offer) -> None:
        """The key works and the configured SSH key names are registered (``GET /api/v1/ssh-keys``;
        with none configured, the launch registers its own key). Lambda publishes no quota to read;
        it refuses at launch with ``global/quota-exceeded``."""
        with self._for_offer(offer.id):
            registered = {name for name, _ in self._ssh_keys()}
            missing = [n for n in self.ssh_key_names if n not in registered]
            if missing:
                raise AuthError(f"SSH key(s) not registered with Lambda: {', '.join(missing)}", provider=self.name,
                                hint=f"add them at https://cloud.lambda.ai/ssh-keys, or fix {SSH_KEYS_ENV}")

    def _ssh_keys(self) -> list[tuple[str, str]]:
        """(name, public key) of every SSH key registered with the account."""
        _, body = self._api.request("GET", "/api/v1/ssh-keys", operation="permission")
        with self._api.reading("GET /api/v1/ssh-keys"):
            return [(need(k, "name", str, where="data[]"), opt(k, "public_key", str, where="data[]") or "")
                    for k in need(body, "data", list)]

    def _key_name(self, ssh_public_key: str | None) -> str:
        """The one key name a launch sends: the configured one, else the name ``ssh_public_key`` is
        registered under, registering it first when it is under none."""
        if self.ssh_key_names:
            return self.ssh_key_names[0]
        if not ssh_public_key or not _key_blob(ssh_public_key):
            raise AuthError("no Lambda SSH key: none is configured and the launch brought none", provider=self.name,
                            hint=f"register a key at https://cloud.lambda.ai/ssh-keys and export "
                                 f"{SSH_KEYS_ENV}=its-name (or pass ssh_key_names=)")
        blob = _key_blob(ssh_public_key)
        for name, registered in self._ssh_keys():
            if _key_blob(registered) == blob:
                return name
        name = KEY_NAME_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:12]
        _, body = self._api.request("POST", "/api/v1/ssh-keys", operation="register-key",
                                    json_body={"name": name, "public_key": ssh_public_key.strip()})
        with self._api.reading("POST /api/v1/ssh-keys"):
            return str(need(need(body, "data", dict), "name", str, where="data"))

    # -- check 3: capacity now ------------------------------------------------------------

    def check_capacity(self, offer: Offer) -> int | None:
        """1 when the offer's type has capacity in its region (any region for "any"), else NoCapacity."""
        with self._for_offer(offer.id):
            region = self._region_with_capacity(offer)
            if region is None:
                raise NoCapacity(f"lambda has no {offer.extra.get('instance_type', offer.id)} capacity "
                                 f"{'in ' + offer.extra['region'] if offer.extra.get('region') else 'anywhere'} now",
                                 provider=self.name, offer=offer.id)
            return 1

    def _region_with_capacity(self, offer: Offer) -> str | None:
        kind = offer.extra.get("instance_type") or offer.id.split("@", 1)[0]
        wanted = offer.extra.get("region")
        types = self._types()
        with self._api.reading("GET /api/v1/instance-types"):
            item = types.get(kind)
            if item is None:
                return None
            regions = [need(r, "name", str, where=f"{kind}.regions")
                       for r in need(item, "regions_with_capacity_available", list, where=kind)]
        if wanted:
            return wanted if wanted in regions else None
        return regions[0] if regions else None

    # -- check 4: launched ----------------------------------------------------------------

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None) -> Allocation:
        """``POST /api/v1/instance-operations/launch`` in the offer's region (for region "any",
        the first with capacity now)."""
        env = dict(env or {})
        with self._for_offer(offer.id):
            check_env_names(env, self.name)
            key_name = self._key_name(ssh_public_key)
            region = offer.extra.get("region") or self._region_with_capacity(offer)
            if not region:
                raise NoCapacity(f"lambda has no {offer.extra.get('instance_type', offer.id)} capacity anywhere now",
                                 provider=self.name)
            body: dict[str, Any] = {"region_name": region,
                                    "instance_type_name": offer.extra.get("instance_type") or offer.id.split("@")[0],
                                    # the API takes exactly one key name; more is refused
                                    "ssh_key_names": [key_name],
                                    "name": machine_name(allocation_id, env.get(WORKSPACE_ENV), limit=64),
                                    "tags": [{"key": ALLOCATION_TAG, "value": allocation_id[:128]}]}
            if env.get(WORKSPACE_ENV):
                body["tags"].append({"key": WORKSPACE_TAG, "value": env[WORKSPACE_ENV][:128]})
            if self.file_system_names:
                body["file_system_names"] = self.file_system_names
            if ssh_public_key or env:
                body["user_data"] = cloud_config(ssh_public_key, env)
            try:
                _, reply = self._api.request("POST", "/api/v1/instance-operations/launch", operation="launch",
                                             json_body=body, secrets=env.values())
            except ComputeError as exc:
                found = self._found_after_lost_answer(exc, allocation_id)
                if found is None:
                    raise
                reply = {"data": {"instance_ids": [found.ref]}}
            with self._api.reading("POST /api/v1/instance-operations/launch"):
                ids = need(need(reply, "data", dict), "instance_ids", list, where="data")
                if not ids or not isinstance(ids[0], str):
                    raise ShapeError("data.instance_ids holds no instance id")
        return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id, ref=ids[0],
                          started=now_iso("seconds"),
                          details={"region": region, "instance_type": body["instance_type_name"],
                                   "requested_image": image, "price_per_hour": offer.price_per_hour})

    # -- lifecycle ------------------------------------------------------------------------

    def status(self, allocation: Allocation) -> AllocationStatus:
        """``GET /api/v1/instances/{id}``: booting is pending; active with an IP is reachable
        (port 22, as :attr:`ssh_user`); unhealthy is running; preempted (or unknown to Lambda) is lost.
        ``spend`` is an estimate: the instance type's own price x time since the launch was
        answered (Lambda's instance record carries no start time)."""
        path = f"/api/v1/instances/{quote(allocation.ref, safe='')}"
        status, body = self._api.request("GET", path, operation="status", allow=(404,))
        if status == 404:
            return AllocationStatus("lost", reason="lambda no longer knows this instance")
        with self._api.reading(f"GET {path}"):
            inst = need(body, "data", dict)
            raw = need(inst, "status", str, where="data")
            if raw not in INSTANCE_STATES:
                raise ShapeError(f"unknown instance status {raw!r}")
            ip = opt(inst, "ip", str, where="data")
            _, spend = spend_since(_price(inst), allocation.started, self.now())
        measured: dict[str, Any] = {"spend": spend, "spend_source": "estimate" if spend is not None else None}
        state = INSTANCE_STATES[raw]
        if raw == "active":
            if ip:
                return AllocationStatus("reachable", ssh=SshEndpoint(ip, 22, self.ssh_user), **measured)
            return AllocationStatus("running", reason="active, but no IP address yet", **measured)
        reasons = {"unhealthy": "lambda reports the instance unhealthy", "preempted": "lambda preempted the instance"}
        return AllocationStatus(state, reason=reasons.get(raw), **measured)

    def list_machines(self) -> list[MachineInfo]:
        """``GET /api/v1/instances``: those named :func:`~.base.machine_name` or tagged with our
        allocation tag. Lambda records no start time, so uptime and spend are unknown here."""
        _, body = self._api.request("GET", "/api/v1/instances", operation="list")
        out = []
        with self._api.reading("GET /api/v1/instances"):
            for inst in need(body, "data", list):
                tags = {opt(t, "key", str): opt(t, "value", str) for t in opt(inst, "tags", list) or []
                        if isinstance(t, dict)}
                ids = parse_machine_name(opt(inst, "name", str))
                aid = tags.get(ALLOCATION_TAG) or (ids[0] if ids else None)
                if not aid:
                    continue
                raw = need(inst, "status", str, where="data[]")
                out.append(MachineInfo(provider=self.name, ref=need(inst, "id", str, where="data[]"),
                                       allocation_id=aid,
                                       workspace_id=tags.get(WORKSPACE_TAG) or (ids[1] if ids else None),
                                       state=INSTANCE_STATES.get(raw, "pending"), name=opt(inst, "name", str) or "",
                                       price_per_hour=_price(inst), details={"status": raw}))
        return [m for m in out if m.state != "terminated"]

    def terminate(self, allocation: Allocation) -> None:
        """``POST /api/v1/instance-operations/terminate``, tried until Lambda confirms; one that is
        already gone (404) is fine."""
        with self._releasing(allocation, "instance"):
            self._api.request("POST", "/api/v1/instance-operations/terminate", operation="terminate",
                              json_body={"instance_ids": [allocation.ref]}, allow=(404,))


def _price(inst: dict[str, Any]) -> float | None:
    """The instance type's $/h from ``instance_type.price_cents_per_hour``."""
    kind = opt(inst, "instance_type", dict)
    cents = opt(kind, "price_cents_per_hour", int) if kind else None
    return None if cents is None else cents / 100


def _key_blob(public_key: str) -> str:
    """``type base64`` of an OpenSSH public key line (its comment dropped), or "" when it is not one."""
    parts = public_key.split()
    return f"{parts[0]} {parts[1]}" if len(parts) >= 2 else ""
