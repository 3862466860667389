"""Reservations: slots on a calendar for an offer type, kept with the workspace in its store."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timezone
from typing import Any

from jupyter_portable.compute.base import Provider
from jupyter_portable.compute.registry import enabled_providers
from jupyter_portable.core.calendar import CHARGE_POLICIES, Booking, can_book, cancel, parse_time, slots
from jupyter_portable.core.errors import ManifestError, NoCapacity, NotSupported, PortableError, UsageError
from jupyter_portable.core.offers import Offer
from jupyter_portable.core.validate import dumps_strict, short_repr
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.routes import list_offers

log = logging.getLogger(__name__)


def _entries(doc: Any) -> list[Any]:
    """The stored entries; a document that is not a list holds none that can be read."""
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise UsageError("the workspace's reservations document is not a list",
                         hint="move workspaces/<id>/reservations.json aside in the store")
    return doc


def _read(entry: Any, index: int) -> Booking | str:
    """The booking an entry holds, or the one-line reason it cannot be read."""
    try:
        return Booking.from_json(entry)
    except UsageError as exc:
        rid = entry.get("reservation_id") if isinstance(entry, dict) else None
        return f"stored reservation {index + 1} ({short_repr(rid)}) cannot be read and is skipped: {exc}"


def read_reservations(ws: Workspace) -> tuple[list[Booking], list[str]]:
    """The workspace's bookings, and one line for each stored entry that could not be read (skipped)."""
    try:
        doc = _entries(ws.store.read_doc(ws.workspace_id, "reservations"))
    except (UsageError, ManifestError) as exc:
        return [], [f"the reservations cannot be read: {exc}"]
    books: list[Booking] = []
    problems: list[str] = []
    for i, entry in enumerate(doc):
        got = _read(entry, i)
        if isinstance(got, Booking):
            books.append(got)
        else:
            problems.append(got)
    return books, problems


def reservations(ws: Workspace) -> list[Booking]:
    """The bookings that can be read; an entry that cannot is logged as a warning and skipped."""
    books, problems = read_reservations(ws)
    for problem in problems:
        log.warning("%s", problem)
    return books


def _kept(entries: list[Any]) -> list[Any]:
    """Entries to write back: unreadable ones stay as they were, unless they cannot be JSON at all."""
    out = []
    for entry in entries:
        try:
            dumps_strict(entry, "reservation")
        except ManifestError:
            log.warning("dropping a stored reservation that is not JSON (it holds NaN or Infinity)")
            continue
        out.append(entry)
    return out


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
    when = parse_time(start, "start")
    if charge not in CHARGE_POLICIES:
        raise UsageError(f"charge must be one of {', '.join(CHARGE_POLICIES)}, not {short_repr(charge)}")
    # The start and length rules first: nothing is bought from a provider for a slot we would refuse.
    reason = can_book(offer_key, when, hours, [], {}, now=now)
    if reason:
        raise UsageError(f"cannot book {offer_key} at {start} for {short_repr(hours)} h: {reason}")
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
        entries = _entries(current)
        existing = [b for b in (_read(e, i) for i, e in enumerate(entries)) if isinstance(b, Booking)]
        reason = can_book(offer.key, when, hours, existing, capacity, now=now)
        if reason and "capacity" in reason:
            raise NoCapacity(f"cannot book {offer.key} at {start} for {hours:g} h: {reason}",
                             provider=provider.name, offer=offer.id)
        if reason:
            raise UsageError(f"cannot book {offer.key} at {start} for {hours:g} h: {reason}")
        new = _kept(entries) + [booking.to_json()]
        dumps_strict(new, "the reservations", error=UsageError)
        return new

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


def cancel_rules(booking: Booking) -> str:
    """The provider's rules for cancelling: AWS Capacity Blocks are final once bought."""
    return "no-cancel" if booking.guarantee == "provider" else "free-until-start"


def booking_view(booking: Booking, now: datetime) -> dict[str, Any]:
    """A booking as the sidebar shows it, with whether it can be cancelled at ``now`` and
    why not (the rule is decided here, not again in the browser)."""
    out = cancel(booking, now, cancel_rules(booking))
    return {**booking.to_json(), "can_cancel": isinstance(out, Booking),
            "cancel_refused": out if isinstance(out, str) else None}


def cancel_reservation(ws: Workspace, reservation_id: str, *, providers: dict[str, Provider] | None = None,
                       now: datetime | None = None) -> Booking:
    """Cancel under the provider's rules (Capacity Blocks cannot be cancelled)."""
    now = now or datetime.now(timezone.utc)
    result: dict[str, Booking] = {}

    def change(current: Any) -> Any:
        entries = _kept(_entries(current))
        for i, entry in enumerate(entries):
            b = _read(entry, i)
            if isinstance(b, Booking) and b.reservation_id == reservation_id:
                rules = cancel_rules(b)
                out = cancel(b, now, rules)
                if isinstance(out, str):
                    raise UsageError(f"cannot cancel {reservation_id}: {out}")
                entries[i] = out.to_json()
                result["booking"] = out
                dumps_strict(entries, "the reservations", error=UsageError)
                return entries
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
