"""Reservations: slots on a calendar for an offer type, kept with the workspace in its store."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from jupyter_portable.compute.base import Provider
from jupyter_portable.compute.registry import enabled_providers
from jupyter_portable.core.calendar import CHARGE_POLICIES, Booking, can_book, cancel, parse_time, slots
from jupyter_portable.core.errors import ManifestError, NoCapacity, NotSupported, PortableError, UsageError
from jupyter_portable.core.offers import Offer
from jupyter_portable.core.validate import dumps_strict, short_repr
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.routes import list_offers, spent_so_far

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
    """The workspace's bookings, and one line for each stored entry that could not be read (skipped).
    A booking bought but kept in this copy (the store refused it then) is recorded first."""
    record_unrecorded(ws)
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


RECORD_TRIES = 5
UNRECORDED = "unrecorded-reservations.json"  # in the copy's .portable/: bought, not yet in the store


def _record(ws: Workspace, booking: Booking, *, check: Any) -> None:
    """Add ``booking`` to the store's reservations; ``check(existing)`` may refuse it first."""

    def add(current: Any) -> Any:
        entries = _entries(current)
        existing = [b for b in (_read(e, i) for i, e in enumerate(entries)) if isinstance(b, Booking)]
        if any(b.reservation_id == booking.reservation_id for b in existing):
            return _kept(entries)  # recorded already (a retry after an answer that was lost)
        check(existing)
        new = _kept(entries) + [booking.to_json()]
        dumps_strict(new, "the reservations", error=UsageError)
        return new

    ws.store.update_doc(ws.workspace_id, "reservations", add)


def _unrecorded_path(ws: Workspace) -> Any:
    return ws.copy.meta / UNRECORDED


def _keep_unrecorded(ws: Workspace, booking: Booking) -> None:
    """Keep a bought booking the store would not take in this copy, to be recorded later."""
    import json

    from jupyter_portable.workdir.files import atomic_write

    path = _unrecorded_path(ws)
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = []
    kept = [e for e in kept if isinstance(e, dict) and e.get("reservation_id") != booking.reservation_id]
    atomic_write(path, json.dumps([*kept, booking.to_json()]).encode(), mode=0o600)


def record_unrecorded(ws: Workspace) -> list[str]:
    """Record in the store every booking bought but kept only in this copy (see :func:`reserve`);
    the ids recorded now. Those the store still refuses stay kept for the next try."""
    import json

    from jupyter_portable.workdir.files import atomic_write

    path = _unrecorded_path(ws)
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    done, left = [], []
    for entry in kept if isinstance(kept, list) else []:
        try:
            booking = Booking.from_json(entry)
            _record(ws, booking, check=lambda existing: None)
            done.append(booking.reservation_id)
        except PortableError:
            left.append(entry)
    if left:
        atomic_write(path, json.dumps(left).encode(), mode=0o600)
    else:
        path.unlink(missing_ok=True)
    return done


def reserve(ws: Workspace, offer_key: str, start: str, hours: float, charge: str = "before", *,
            providers: dict[str, Provider] | None = None, now: datetime | None = None,
            sleep: Callable[[float], None] = time.sleep) -> Booking:
    """Book a slot for an offer type, with the charge policy; persisted with the workspace.

    The booking is checked against the stored ones before anything is bought. A slot the
    provider sold (AWS Capacity Blocks: paid, final) is then recorded whatever else was booked
    meanwhile, retried ``RECORD_TRIES`` times; if the store still refuses it, it is kept in this
    copy (``.portable/unrecorded-reservations.json``) and recorded by the next
    :func:`read_reservations`, and the error names the reservation id. Never lost."""
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
    refuse_over_budget(ws, offer, hours, start)
    listed = getattr(provider, "catalog", None)
    full = listed.offer(offer.id) if listed is not None else None  # capacity of the type, not what is free now
    capacity: dict[str, int | None] = {offer.key: full.capacity if full is not None else offer.capacity} \
        if listed is not None else {}

    def refuse_if_taken(existing: list[Booking]) -> None:
        reason = can_book(offer.key, when, hours, existing, capacity, now=now)
        if reason and "capacity" in reason:
            raise NoCapacity(f"cannot book {offer.key} at {start} for {hours:g} h: {reason}",
                             provider=provider.name, offer=offer.id)
        if reason:
            raise UsageError(f"cannot book {offer.key} at {start} for {hours:g} h: {reason}")

    # the booking as the store holds it now, before anything is bought (a refusal costs nothing)
    refuse_if_taken(reservations_strict(ws))
    Booking.new("res-check", offer.key, when, hours, charge=charge, guarantee="best-effort",
                price=round(offer.price_per_hour * hours, 2), created=now)
    try:
        sold = provider.reserve(offer, start=when.isoformat().replace("+00:00", "Z"), hours=hours)
        guarantee, price, rid = sold.guarantee, sold.price, sold.reservation_id
        # the booked slot's own offer (a Capacity Block may be in another zone than asked)
        key = f"{provider.name}/{sold.offer_id}" if sold.offer_id else offer.key
    except NotSupported:
        guarantee, price, rid = "best-effort", round(offer.price_per_hour * hours, 2), f"res-{uuid.uuid4().hex[:12]}"
        key = offer.key
    booking = Booking.new(rid, key, when, hours, charge=charge, guarantee=guarantee, price=price, created=now)
    if guarantee != "provider":
        try:
            _record(ws, booking, check=refuse_if_taken)
        except PortableError:
            if guarantee == "capacity-checked":
                try:
                    from jupyter_portable.compute.base import Reservation

                    provider.cancel_reservation(Reservation(rid, provider.name, offer.id, booking.start.isoformat(),
                                                            hours, guarantee, price))
                except PortableError:
                    pass
            raise
        return booking
    # bought and paid: record it, whatever was booked meanwhile
    last: PortableError | None = None
    for attempt in range(RECORD_TRIES):
        try:
            _record(ws, booking, check=lambda existing: None)
            return booking
        except PortableError as exc:
            last = exc
            if attempt + 1 < RECORD_TRIES:
                sleep(min(8.0, 0.5 * 2 ** attempt))
    _keep_unrecorded(ws, booking)
    raise PortableError(f"{provider.name} sold reservation {rid} ({key} from {booking.start.isoformat()}, "
                        f"{hours:g} h, ${price:,.2f}) but the store did not record it: {last}; it is kept in "
                        f"this copy and recorded when the store answers",
                        hint="run `jupyter portable reservations` again later; do not buy it again")


def refuse_over_budget(ws: Workspace, offer: Offer, hours: float, start: str) -> None:
    """UsageError when a booking of ``offer`` for ``hours`` breaks the $/h cap or does not fit
    what is left of the budget (bookings not yet charged included), in a route's words."""
    from jupyter_portable.core.routing import budget_reason
    from jupyter_portable.core.spend import admits_price
    from jupyter_portable.orchestration.settings import load_settings

    budget = load_settings(ws).budget
    why = admits_price(offer.price_per_hour, budget)
    if why is None and budget.total is not None:
        # a slot booked and not cancelled is money promised: it counts against what is left
        promised = sum(b.price for b in reservations(ws) if b.status == "booked")
        left = max(0.0, budget.total - spent_so_far(ws) - promised)
        why = budget_reason(round(offer.price_per_hour * hours, 2), hours, left)
    if why:
        raise UsageError(f"cannot book {offer.key} at {start} for {hours:g} h: {why}",
                         hint="raise the budget or the $/h cap in the settings, or book fewer hours")


def reservations_strict(ws: Workspace) -> list[Booking]:
    """The stored bookings; a document that cannot be read raises (nothing is bought on it)."""
    doc = _entries(ws.store.read_doc(ws.workspace_id, "reservations"))
    return [b for b in (_read(e, i) for i, e in enumerate(doc)) if isinstance(b, Booking)]


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
