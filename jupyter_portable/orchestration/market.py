"""The compute market seen from one workspace: offers across providers, routes with their
whole cost, the workspace's settings (requirements, caps) and its reservations.

Settings and reservations are documents kept with the workspace in its store, so every
copy and every machine sees the same ones. Which providers are asked is configuration:
``JUPYTER_PORTABLE_PROVIDERS`` (comma-separated; default ``local``, plus ``ssh`` when a
hosts file exists). Cloud providers are opt-in, so no API is called unless asked for.
"""

from __future__ import annotations

import importlib
import math
import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from jupyter_portable.compute.base import Provider
from jupyter_portable.core.calendar import Booking, can_book, cancel, slots
from jupyter_portable.core.errors import ComputeError, NoCapacity, NotSupported, PortableError, UsageError
from jupyter_portable.core.offers import Checks, Offer, Requirements
from jupyter_portable.core.routing import Caps, Route, Signals, WorkspaceFacts, rank_routes
from jupyter_portable.core.spend import Budget
from jupyter_portable.engine.workspace import Workspace

PROVIDERS: dict[str, tuple[str, str]] = {
    "local": ("jupyter_portable.compute.local", "LocalMarket"),
    "ssh": ("jupyter_portable.compute.ssh", "SshProvider"),
    "runpod": ("jupyter_portable.compute.runpod", "RunPodProvider"),
    "vastai": ("jupyter_portable.compute.vastai", "VastProvider"),
    "lambda": ("jupyter_portable.compute.lambdalabs", "LambdaProvider"),
    "aws": ("jupyter_portable.compute.aws", "AwsProvider"),
    "gcp": ("jupyter_portable.compute.gcp", "GcpProvider"),
}
DEFAULT_HOURS = 8.0


def provider_names(env: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ) if env is None else env
    raw = env.get("JUPYTER_PORTABLE_PROVIDERS", "").strip()
    if raw:
        names = [n.strip() for n in raw.split(",") if n.strip()]
        unknown = [n for n in names if n not in PROVIDERS]
        if unknown:
            raise UsageError(f"unknown provider(s) in JUPYTER_PORTABLE_PROVIDERS: {', '.join(unknown)}",
                             hint=f"choose from {', '.join(PROVIDERS)}")
        return names
    names = ["local"]
    try:
        from jupyter_portable.compute.hosts import default_hosts_path

        if default_hosts_path().is_file():
            names.append("ssh")
    except (ImportError, PortableError):
        pass
    return names


def make_provider(name: str) -> Provider:
    if name not in PROVIDERS:
        raise UsageError(f"unknown provider {name!r}", hint=f"choose from {', '.join(PROVIDERS)}")
    module, cls = PROVIDERS[name]
    try:
        return getattr(importlib.import_module(module), cls)()
    except ComputeError:
        raise
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"provider {name} is not available in this installation: {exc}") from exc


def enabled_providers(env: dict[str, str] | None = None) -> dict[str, Provider]:
    return {name: make_provider(name) for name in provider_names(env)}


@dataclass
class Settings:
    """What this workspace needs and may spend, kept with it."""

    requirements: Requirements = field(default_factory=Requirements)
    budget: Budget = field(default_factory=Budget)
    hours: float = DEFAULT_HOURS
    # the kernel's auto-snapshot on the worker, in minutes (0: off); None: the machine's default
    autosnapshot_minutes: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"requirements": self.requirements.to_json(), "budget": self.budget.to_json(), "hours": self.hours,
                "autosnapshot_minutes": self.autosnapshot_minutes}

    @classmethod
    def from_json(cls, obj: Any) -> "Settings":
        if obj is None:
            return cls()
        if not isinstance(obj, dict) or set(obj) - {"requirements", "budget", "hours", "autosnapshot_minutes"}:
            raise UsageError("the workspace settings document is malformed")
        b = obj.get("budget") or {}
        try:
            budget = Budget(max_price_per_hour=b.get("max_price_per_hour"), total=b.get("total"),
                            warn_fraction=b.get("warn_fraction", 0.8))
            hours = float(obj.get("hours", DEFAULT_HOURS))
            auto = obj.get("autosnapshot_minutes")
            auto = None if auto is None else float(auto)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"the workspace settings are malformed: {exc}") from exc
        if auto is not None and not (auto >= 0 and math.isfinite(auto)):
            raise UsageError(f"autosnapshot_minutes must be 0 (off) or more, got {auto}")
        return cls(Requirements.from_json(obj.get("requirements")), budget, hours, auto)


def load_settings(ws: Workspace) -> Settings:
    return Settings.from_json(ws.store.read_doc(ws.workspace_id, "settings"))


def update_settings(ws: Workspace, **changes: Any) -> Settings:
    """Change requirement and budget fields (None leaves a field as it is; "" clears it)."""
    req_fields = {"gpus", "gpu_count", "min_gpu_memory_gb", "driver", "min_cuda", "image", "max_price_per_hour",
                  "regions"}
    budget_fields = {"budget_max_price_per_hour": "max_price_per_hour", "budget_total": "total",
                     "budget_warn_fraction": "warn_fraction"}
    unknown = set(changes) - req_fields - set(budget_fields) - {"hours", "autosnapshot_minutes"}
    if unknown:
        raise UsageError(f"unknown setting(s): {', '.join(sorted(unknown))}")

    def change(current: Any) -> Any:
        s = Settings.from_json(current).to_json()
        for key, value in changes.items():
            if value is None:
                continue
            value = None if value == "" else value
            if key in req_fields:
                s["requirements"][key] = value if value is not None else ([] if key in ("gpus", "regions") else None)
            elif key in budget_fields:
                s["budget"][budget_fields[key]] = value
            else:
                s[key] = value
        Settings.from_json(s)  # validate before it is written
        return s

    return Settings.from_json(ws.store.update_doc(ws.workspace_id, "settings", change))


def list_offers(providers: dict[str, Provider], requirements: Requirements | None = None,
                gpu: str | None = None) -> tuple[list[Offer], dict[str, str]]:
    """Every listed offer, and for each provider that failed, why (one line)."""
    offers: list[Offer] = []
    errors: dict[str, str] = {}
    for name, provider in providers.items():
        try:
            got = provider.offers(requirements)
        except PortableError as exc:
            errors[name] = exc.one_line()
            continue
        offers += [o for o in got if not gpu or gpu.lower() in o.gpu.lower()]
    offers.sort(key=lambda o: (o.gpu, o.price_per_hour, o.key))
    return offers, errors


def workspace_facts(ws: Workspace, providers: dict[str, Provider]) -> WorkspaceFacts:
    """How much this workspace weighs and where its store is, for the cost of moving it."""
    manifest = ws.manifest()
    size = manifest.total_bytes if manifest else 0
    url = ws.config.store
    if url.startswith("s3"):
        custom = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        return WorkspaceFacts(bytes_to_move=size, store_region=region, store_provider=None if custom else "aws",
                              store_egress_per_gb=0.09, workspace_bytes=size)
    catalog = getattr(providers.get("local"), "catalog", None)
    if catalog is not None:
        # The local market's catalog says where a local store sits and what leaving it costs,
        # so a far region of the demo market pays for the move like a far cloud would.
        return WorkspaceFacts(bytes_to_move=size, store_region=catalog.store_region, store_provider="local",
                              store_egress_per_gb=catalog.store_egress_per_gb, workspace_bytes=size)
    return WorkspaceFacts(bytes_to_move=size, store_region=None, store_provider=None, store_egress_per_gb=0.0,
                          workspace_bytes=size)


def spent_so_far(ws: Workspace) -> float:
    manifest = ws.manifest()
    return sum(float(a.get("spend") or 0) for a in (manifest.allocations if manifest else ()))


def signals_from_history(ws: Workspace) -> Signals:
    """Recent launch failures and driver refusals per offer, from the allocation history."""
    manifest = ws.manifest()
    failures: dict[str, int] = {}
    mismatches: dict[str, int] = {}
    for a in manifest.allocations if manifest else ():
        key = f"{a.get('provider')}/{a.get('offer')}"
        reason = (a.get("stop_reason") or "").lower()
        if a.get("state") in ("failed", "refused"):
            failures[key] = failures.get(key, 0) + 1
        if "driver" in reason:
            mismatches[key] = mismatches.get(key, 0) + 1
    return Signals(recent_launch_failures=failures, driver_mismatches=mismatches)


def compute_routes(ws: Workspace, *, hours: float | None = None, providers: dict[str, Provider] | None = None,
                   gpu: str | None = None) -> tuple[list[Route], dict[str, str]]:
    """Every offer as a route to this workspace's next verified state, ranked by whole cost."""
    providers = providers if providers is not None else enabled_providers()
    settings = load_settings(ws)
    offers, errors = list_offers(providers, None, gpu)
    budget = settings.budget
    left = None if budget.total is None else max(0.0, budget.total - spent_so_far(ws))
    caps = Caps(max_price_per_hour=budget.max_price_per_hour, budget_left=left)
    checks = {o.key: Checks(listed=True) for o in offers}
    routes = rank_routes(workspace_facts(ws, providers), offers, settings.requirements,
                         hours=hours if hours is not None else settings.hours, caps=caps,
                         signals=signals_from_history(ws), checks=checks)
    return routes, errors


# -- reservations ----------------------------------------------------------------------

def _parse_start(text: str) -> datetime:
    try:
        start = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(f"--start {text!r} is not an ISO time like 2026-12-01T09:00Z") from exc
    if start.tzinfo is None:
        raise UsageError(f"--start {text!r} needs a time zone (e.g. a trailing Z for UTC)")
    return start.astimezone(timezone.utc)


def reservations(ws: Workspace) -> list[Booking]:
    return [Booking.from_json(b) for b in ws.store.read_doc(ws.workspace_id, "reservations") or []]


def _find_offer(providers: dict[str, Provider], offer_key: str) -> tuple[Provider, Offer]:
    name, _, offer_id = offer_key.partition("/")
    if name not in providers or not offer_id:
        raise UsageError(f"offer {offer_key!r} is not provider/offer-id of an enabled provider",
                         hint="see `jupyter portable offers` for the keys")
    provider = providers[name]
    for offer in provider.offers(None):
        if offer.id == offer_id:
            return provider, offer
    raise UsageError(f"{name} does not list an offer {offer_id!r}", hint="see `jupyter portable offers`")


def reserve(ws: Workspace, offer_key: str, start: str, hours: float, charge: str = "before", *,
            providers: dict[str, Provider] | None = None, now: datetime | None = None) -> Booking:
    """Book a slot for an offer type, with the charge policy; persisted with the workspace."""
    providers = providers if providers is not None else enabled_providers()
    now = now or datetime.now(timezone.utc)
    when = _parse_start(start)
    provider, offer = _find_offer(providers, offer_key)
    try:
        sold = provider.reserve(offer, start=when.isoformat().replace("+00:00", "Z"), hours=hours)
        guarantee, price, rid = sold.guarantee, sold.price, sold.reservation_id
    except NotSupported:
        guarantee, price, rid = "best-effort", round(offer.price_per_hour * hours, 2), f"res-{uuid.uuid4().hex[:12]}"
    listed = getattr(provider, "catalog", None)
    full = listed.offer(offer.id) if listed is not None else None  # capacity of the type, not what is free now
    capacity: dict[str, int | None] = {
        offer.key: (full.capacity if full is not None else offer.capacity) if guarantee == "capacity-checked" else None}
    booking = Booking.new(rid, offer.key, when, hours, charge=charge, guarantee=guarantee, price=price, created=now)

    def add(current: Any) -> Any:
        existing = [Booking.from_json(b) for b in current or []]
        reason = can_book(offer.key, when, hours, existing, capacity, now=now)
        if reason and "capacity" in reason:
            raise NoCapacity(f"cannot book {offer.key} at {start} for {hours:g} h: {reason}",
                             provider=provider.name, offer=offer.id)
        if reason:
            raise UsageError(f"cannot book {offer.key} at {start} for {hours:g} h: {reason}")
        return [b.to_json() for b in existing] + [booking.to_json()]

    try:
        ws.store.update_doc(ws.workspace_id, "reservations", add)
    except PortableError:
        if guarantee != "best-effort":
            try:
                from jupyter_portable.compute.base import Reservation

                provider.cancel_reservation(Reservation(rid, provider.name, offer.id, booking.start.isoformat(),
                                                        hours, guarantee, price))
            except PortableError:
                pass
        raise
    return booking


def cancel_reservation(ws: Workspace, reservation_id: str, *, providers: dict[str, Provider] | None = None,
                       now: datetime | None = None) -> Booking:
    """Cancel under the provider's rules (Capacity Blocks cannot be cancelled)."""
    now = now or datetime.now(timezone.utc)
    result: dict[str, Booking] = {}

    def change(current: Any) -> Any:
        books = [Booking.from_json(b) for b in current or []]
        for i, b in enumerate(books):
            if b.reservation_id == reservation_id:
                rules = "no-cancel" if b.guarantee == "provider" else "free-until-start"
                out = cancel(b, now, rules)
                if isinstance(out, str):
                    raise UsageError(f"cannot cancel {reservation_id}: {out}")
                books[i] = out
                result["booking"] = out
                return [x.to_json() for x in books]
        raise UsageError(f"no reservation {reservation_id!r} in this workspace",
                         hint="see `jupyter portable reservations`")

    ws.store.update_doc(ws.workspace_id, "reservations", change)
    booking = result["booking"]
    providers = providers if providers is not None else enabled_providers()
    name = booking.offer_key.split("/", 1)[0]
    if booking.guarantee == "capacity-checked" and name in providers:
        from jupyter_portable.compute.base import Reservation

        try:
            providers[name].cancel_reservation(Reservation(booking.reservation_id, name,
                                                           booking.offer_key.split("/", 1)[1],
                                                           booking.start.isoformat(), booking.hours,
                                                           booking.guarantee, booking.price))
        except NotSupported:
            pass
    return booking


def calendar(ws: Workspace, days: int = 7, *, providers: dict[str, Provider] | None = None,
             now: datetime | None = None) -> dict[str, Any]:
    """Free and taken hourly slots per offer type for the next ``days`` days."""
    providers = providers if providers is not None else enabled_providers()
    now = now or datetime.now(timezone.utc)
    day_start = now.replace(minute=0, second=0, microsecond=0)
    offers, _ = list_offers(providers)
    local = getattr(providers.get("local"), "catalog", None)
    capacity: dict[str, int | None] = {}
    for o in offers:
        full = local.offer(o.id) if local is not None and o.provider == "local" else None
        capacity[o.key] = full.capacity if full is not None else None
    return slots(day_start, days, reservations(ws), capacity, [o.key for o in offers])


# -- acquiring a machine for the workspace ------------------------------------------------

def routes_to_try(ws: Workspace, route_id: str | None = None, *, hours: float | None = None,
                  providers: dict[str, Provider] | None = None) -> list[Route]:
    """The open routes in the order to try them: ``route_id`` first when given, then by cost.
    UsageError for an unknown or blocked ``route_id``; NoCapacity when every route is blocked."""
    routes, _ = compute_routes(ws, hours=hours, providers=providers)
    usable = [r for r in routes if not r.blocked]
    if route_id is not None:
        chosen = [r for r in routes if r.id == route_id]
        if not chosen:
            raise UsageError(f"no route {route_id!r}", hint="see `jupyter portable routes`")
        if chosen[0].blocked:
            raise UsageError(f"route {route_id} is blocked: {chosen[0].blocked}")
        usable = chosen + [r for r in usable if r.id != route_id]
    if not usable:
        raise NoCapacity("no route is open: every offer is blocked", hint="see `jupyter portable routes`")
    return usable


def acquire_for(ws: Workspace, *, hours: float | None = None, providers: dict[str, Provider] | None = None,
                route_id: str | None = None, on_event: Any = None, boot_timeout_s: float = 120) -> dict[str, Any]:
    """Launch the best admissible route (or ``route_id``), failing over down the ranking.

    Every route given up is recorded in the workspace's allocation history: an admission
    refusal as an environment fault (the work did not run), anything else as a failure.
    """
    from jupyter_portable.compute.acquire import acquire
    from jupyter_portable.store.repo import now_iso

    providers = providers if providers is not None else enabled_providers()
    usable = routes_to_try(ws, route_id, hours=hours, providers=providers)
    settings = load_settings(ws)
    by_key = {r.offer.key: r for r in usable}

    def new_id() -> str:
        return f"al-{uuid.uuid4().hex[:12]}"

    try:
        allocation, attempts = acquire([r.offer for r in usable], providers, settings.requirements,
                                       allocation_id_factory=new_id, on_event=on_event,
                                       boot_timeout_s=boot_timeout_s)
    except NoCapacity as exc:
        given_up: list[Any] = list(exc.context.get("attempts") or [])  # type: ignore[call-overload]
        for attempt in given_up:
            record_attempt(ws, attempt)
        raise
    for attempt in attempts:
        record_attempt(ws, attempt)
    offer = by_key[f"{allocation.provider}/{allocation.offer_id}"].offer
    ws.record_allocation({"allocation_id": allocation.allocation_id, "provider": allocation.provider,
                          "offer": allocation.offer_id, "gpu": offer.gpu, "region": offer.region,
                          "ref": allocation.ref, "price_per_hour": offer.price_per_hour,
                          "started": allocation.started or now_iso(), "state": "active", "spend": 0.0,
                          "currency": "USD", "failures": [a.reason for a in attempts]})
    return {"allocation": allocation.to_json(), "route": by_key[offer.key].id,
            "attempts": [a.to_json() for a in attempts]}


def record_attempt(ws: Workspace, attempt: Any, *, epoch: int | None = None) -> None:
    from jupyter_portable.store.repo import now_iso

    provider, _, offer = attempt.offer_key.partition("/")
    fault = "environment fault: " if attempt.environment_fault else ""
    ws.record_allocation({
        "allocation_id": attempt.allocation_id or f"attempt-{uuid.uuid4().hex[:12]}",
        "provider": provider, "offer": offer, "state": "refused" if attempt.environment_fault else "failed",
        "started": now_iso(), "stopped": now_iso(),
        "stop_reason": f"{fault}{attempt.stage}: {attempt.reason}", "spend": 0.0, "currency": "USD",
        "failures": [attempt.reason]}, epoch=epoch)


# -- spend and the budget ----------------------------------------------------------------

def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def budget_report(ws: Workspace, *, providers: dict[str, Provider] | None = None,
                  now: datetime | None = None) -> dict[str, Any]:
    """Spend so far (closed allocations as recorded, active ones from the provider's figure
    or price x time) and where the budget stands: ok, warn, or exhausted."""
    from jupyter_portable.compute.base import Allocation
    from jupyter_portable.core.spend import budget_state, spend_of

    now = now or datetime.now(timezone.utc)
    providers = providers if providers is not None else enabled_providers()
    head, _ = ws.store.read_head(ws.workspace_id)
    # the head, not this copy's version: machines record their fate there while this copy stays put
    manifest = ws.store.read_manifest(ws.workspace_id, head.version) if head.version else None
    spent, price, active = 0.0, 0.0, []
    for a in manifest.allocations if manifest else ():
        if a.get("state") != "active":
            spent += float(a.get("spend") or 0)
            continue
        figure = None
        provider = providers.get(a.get("provider", ""))
        if provider is not None and a.get("ref"):
            try:
                st = provider.status(Allocation(a["allocation_id"], a["provider"], a.get("offer", ""), a["ref"],
                                                a.get("started", "")))
                figure = st.spend
            except PortableError:
                figure = None
        started = _parse_time(a.get("started")) or now
        cost = spend_of(float(a.get("price_per_hour") or 0), started, None, now, figure)
        spent += cost
        price += float(a.get("price_per_hour") or 0)
        active.append({**a, "spend": round(cost, 4)})
    state = budget_state(spent, load_settings(ws).budget, price)
    return {**state, "active": active}


def enforce_budget(ws: Workspace, *, providers: dict[str, Provider] | None = None, seal: Any = None,
                   now: datetime | None = None) -> dict[str, Any]:
    """At the budget, seal then release every active allocation; never kill work unsaved.

    ``seal(ws)`` publishes the final state and reads it back; the default snapshots this
    copy and verifies the published version. (The worker's own seal replaces it once
    workers publish from the machine.)
    """
    from jupyter_portable.compute.base import Allocation
    from jupyter_portable.store.repo import now_iso

    providers = providers if providers is not None else enabled_providers()
    report = budget_report(ws, providers=providers, now=now)
    if report["state"] != "exhausted":
        return report

    def default_seal(w: Workspace) -> None:
        w.snapshot("sealed: budget exhausted", progress=None)
        result = w.verify()
        if not result.ok:
            raise PortableError("the sealed version did not read back: " +
                                "; ".join(f"{m['path']}: {m['reason']}" for m in result.mismatches[:3]))

    (seal or default_seal)(ws)  # a failed seal raises: the machine is NOT released unsaved
    released = []
    for a in report["active"]:
        provider = providers.get(a["provider"])
        if provider is not None and a.get("ref"):
            provider.terminate(Allocation(a["allocation_id"], a["provider"], a.get("offer", ""), a["ref"],
                                          a.get("started", "")))
        record = {k: v for k, v in a.items() if k != "spend"}
        record.update(state="released", stopped=now_iso(), spend=a["spend"],
                      stop_reason="budget exhausted: sealed, then released")
        ws.record_allocation(record)
        released.append(a["allocation_id"])
    return {**report, "released": released}
