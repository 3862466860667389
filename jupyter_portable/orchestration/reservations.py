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
from jupyter_portable.core.calendar import (
    CHARGE_POLICIES,
    GUARANTEE_TEXT,
    Booking,
    can_book,
    cancel,
    charge_time,
    parse_time,
    promised_guarantee,
    slots,
)
from jupyter_portable.core.errors import ManifestError, NoCapacity, NotSupported, PortableError, UsageError
from jupyter_portable.core.offers import Offer
from jupyter_portable.core.times import to_iso
from jupyter_portable.core.validate import dumps_strict, short_repr
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.budget import budget_report
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
# what a refused booking advises: never "book a reservation", which is what was refused
BOOKING_HINT = "choose another start time, fewer hours, or another offer"


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


def _keep_unrecorded(ws: Workspace, booking: Booking) -> None:
    """Keep a bought booking the store would not take in this copy, to be recorded later."""
    import json

    try:
        kept = json.loads(ws.copy.unrecorded_reservations_bytes() or b"[]")
    except (OSError, ValueError):
        kept = []
    kept = [e for e in kept if isinstance(e, dict) and e.get("reservation_id") != booking.reservation_id]
    ws.copy.write_unrecorded_reservations(json.dumps([*kept, booking.to_json()]).encode())


def record_unrecorded(ws: Workspace) -> list[str]:
    """Record in the store every booking bought but kept only in this copy (see :func:`reserve`);
    the ids recorded now. Those the store still refuses stay kept for the next try."""
    import json

    try:
        data = ws.copy.unrecorded_reservations_bytes()
        if data is None:
            return []
        kept = json.loads(data)
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
        ws.copy.write_unrecorded_reservations(json.dumps(left).encode())
    else:
        ws.copy.clear_unrecorded_reservations()
    return done


def quote(ws: Workspace, offer_key: str, start: str, hours: float, *,
          providers: dict[str, Provider] | None = None, now: datetime | None = None) -> dict[str, Any]:
    """What booking ``offer_key`` for the slot would cost, bought now, and where the figure comes
    from; nothing is bought. A provider that sells reservations quotes its own price and length
    (AWS: the Capacity Block offering's upfront fee, for whole days); elsewhere the listed $/h x
    ``hours``."""
    providers = providers if providers is not None else enabled_providers()
    now = now or datetime.now(timezone.utc)
    when = parse_time(start, "start")
    reason = can_book(offer_key, when, hours, [], {}, now=now)
    if reason:
        raise UsageError(f"cannot book {offer_key} at {start} for {short_repr(hours)} h: {reason}")
    provider, offer = _find_offer(providers, offer_key)
    sold = provider.quote_reservation(offer, start=_z(when), hours=hours)
    if sold is None:
        return {"offer": offer.key, "start": _z(when), "hours": hours, "price": round(offer.price_per_hour * hours, 2),
                "currency": "USD", "guarantee": None, "price_source": "listed $/h x hours"}
    return {"offer": offer.key, "provider_offer": f"{provider.name}/{sold.offer_id}", "start": sold.start,
            "hours": sold.hours, "requested_hours": hours, "price": sold.price,
            "currency": sold.details.get("currency", "USD"), "guarantee": sold.guarantee,
            "price_source": sold.details.get("price_source", f"{provider.name}'s quote")}


def _z(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _confirmed(provider: Provider, offer: Offer, start: str, hours: float, sold: Any,
               max_price: float | None) -> None:
    """UsageError showing what the provider will charge unless ``max_price`` (the price the user saw
    and accepted) covers it: a provider's booking is paid at once and final."""
    days = sold.hours / 24
    what = (f"{provider.name} charges {sold.details.get('currency', 'USD')} {sold.price:,.2f} for this block: "
            f"{days:g} whole day{'s' if days != 1 else ''} ({sold.hours:g} h for the {hours:g} h asked) from "
            f"{sold.start} in {sold.offer_id}, at the offering's upfront fee, paid when bought and not refundable")
    if max_price is None:
        raise UsageError(f"cannot book {offer.key} at {start} before its price is confirmed: {what}",
                         hint=f"to buy it, confirm that price: --max-price {sold.price:.2f} (or see --quote)")
    if sold.price > max_price + 0.005:
        raise UsageError(f"cannot book {offer.key} at {start}: {what}, more than the {max_price:,.2f} confirmed",
                         hint="confirm the price it costs now (--quote shows it), or book another slot")


def _admit(ws: Workspace, offer_key: str, start: str, hours: float, charge: str, *,
           providers: dict[str, Provider], now: datetime, max_price: float | None) -> tuple[
               Provider, Offer, datetime, Callable[[list[Booking]], None], Any]:
    """Every check a booking passes before anything is bought, raising the refusal (UsageError,
    NoCapacity): :func:`reserve` runs them, and :func:`check_booking` reports them without booking.
    Returns the provider, the offer, the start, the check of the stored bookings (run again when the
    booking is recorded) and the provider's quote (None where it does not sell reservations)."""
    when = parse_time(start, "start")
    if charge not in CHARGE_POLICIES:
        raise UsageError(f"charge must be one of {', '.join(CHARGE_POLICIES)}, not {short_repr(charge)}")
    # The start and length rules first: nothing is bought from a provider for a slot we would refuse.
    reason = can_book(offer_key, when, hours, [], {}, now=now)
    if reason:
        raise UsageError(f"cannot book {offer_key} at {start} for {short_repr(hours)} h: {reason}")
    provider, offer = _find_offer(providers, offer_key)
    listed = getattr(provider, "catalog", None)
    full = listed.offer(offer.id) if listed is not None else None  # capacity of the type, not what is free now
    capacity: dict[str, int | None] = {offer.key: full.capacity if full is not None else offer.capacity} \
        if listed is not None else {}

    def refuse_if_taken(existing: list[Booking]) -> None:
        reason = can_book(offer.key, when, hours, existing, capacity, now=now)
        if reason and "capacity" in reason:
            raise NoCapacity(f"cannot book {offer.key} at {start} for {hours:g} h: {reason}",
                             provider=provider.name, offer=offer.id, hint=BOOKING_HINT)
        if reason:
            raise UsageError(f"cannot book {offer.key} at {start} for {hours:g} h: {reason}")

    # the booking as the store holds it now, before anything is bought (a refusal costs nothing)
    refuse_if_taken(reservations_strict(ws))
    # what the provider charges for it (AWS: whole days at the offering's fee) is what the budget checks
    sold_quote = provider.quote_reservation(offer, start=_z(when), hours=hours)
    refuse_over_budget(ws, offer, hours, start, quote=sold_quote, now=now, providers=providers)
    if sold_quote is not None:
        _confirmed(provider, offer, start, hours, sold_quote, max_price)
    Booking.new("res-check", offer.key, when, hours, charge=charge, guarantee="best-effort",
                price=round(offer.price_per_hour * hours, 2), created=now)
    return provider, offer, when, refuse_if_taken, sold_quote


def check_booking(ws: Workspace, offer_key: str, start: str, hours: float, charge: str = "before", *,
                  providers: dict[str, Provider] | None = None, now: datetime,
                  max_price: float | None = None) -> dict[str, Any]:
    """What :func:`reserve` would answer at ``now``, with nothing booked or bought: ``problem``, the
    refusal it would raise (None when it would book), ``hint``, ``charge_at`` and ``price`` (None where
    the refusal comes before they are known). Errors that are not refusals (a ``start`` that is not a
    time between years 1 and 9999, a store or provider that does not answer) are raised, as the
    booking would raise them."""
    providers = providers if providers is not None else enabled_providers()
    answer: dict[str, Any] = {"offer": offer_key, "start": start, "hours": hours, "charge": charge,
                              "charge_at": None, "price": None, "problem": None, "hint": None}
    when = parse_time(start, "start")  # not a time (or past year 1..9999): the request is wrong, raised
    try:
        if charge in CHARGE_POLICIES:
            answer["charge_at"] = to_iso(charge_time(when, charge, now), "auto")
        _, offer, _, _, sold = _admit(ws, offer_key, start, hours, charge, providers=providers, now=now,
                                      max_price=max_price)
        answer["price"] = round(offer.price_per_hour * hours, 2) if sold is None else sold.price
    except (UsageError, NoCapacity) as exc:
        answer["problem"], answer["hint"] = str(exc), exc.hint
    return answer


def reserve(ws: Workspace, offer_key: str, start: str, hours: float, charge: str = "before", *,
            providers: dict[str, Provider] | None = None, now: datetime | None = None,
            sleep: Callable[[float], None] = time.sleep, max_price: float | None = None) -> Booking:
    """Book a slot for an offer type, with the charge policy; persisted with the workspace.

    Where the provider sells the slot (AWS Capacity Blocks) its own quote is what is checked against
    the budget (the offering's upfront fee, whole days), and it is bought only when ``max_price``,
    the price the user was shown and confirmed, covers it. The booking is checked against the
    stored ones before anything is bought. A slot the
    provider sold (AWS Capacity Blocks: paid, final) is then recorded whatever else was booked
    meanwhile, retried ``RECORD_TRIES`` times; if the store still refuses it, it is kept in this
    copy (``.portable/unrecorded-reservations.json``) and recorded by the next
    :func:`read_reservations`, and the error names the reservation id. Never lost."""
    providers = providers if providers is not None else enabled_providers()
    now = now or datetime.now(timezone.utc)
    provider, offer, when, refuse_if_taken, sold_quote = _admit(ws, offer_key, start, hours, charge,
                                                                providers=providers, now=now, max_price=max_price)
    try:
        # a provider that quoted buys exactly what it quoted (and what was checked and confirmed)
        bought_as: dict[str, Any] = {} if sold_quote is None else {"quote": sold_quote}
        sold = provider.reserve(offer, start=_z(when), hours=hours, **bought_as)
        guarantee, price, rid = sold.guarantee, sold.price, sold.reservation_id
        if guarantee == "provider":
            hours = sold.hours  # what was sold and paid for: a Capacity Block is whole days
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


def refuse_over_budget(ws: Workspace, offer: Offer, hours: float, start: str, *, quote: Any = None,
                       now: datetime | None = None, providers: dict[str, Provider] | None = None) -> None:
    """UsageError when a booking of ``offer`` for ``hours`` breaks the $/h cap or does not fit
    what is left of the budget (:func:`.budget.budget_report`'s ``left``, at ``now`` on the calendar),
    in a route's words. With a provider's ``quote`` (a :class:`~jupyter_portable.compute.base.Reservation`),
    its price and hours are what is checked: what the provider charges, not the listed $/h x the hours asked."""
    from jupyter_portable.core.routing import budget_reason
    from jupyter_portable.core.spend import admits_price
    from jupyter_portable.orchestration.settings import load_settings

    budget = load_settings(ws).budget
    price, charged = (round(offer.price_per_hour * hours, 2), hours) if quote is None else (quote.price, quote.hours)
    why = admits_price(price / charged if charged > 0 else offer.price_per_hour, budget)
    if why is None and budget.total is not None:
        left = budget_report(ws, providers=providers, calendar_now=now)["left"]
        why = budget_reason(price, charged, left)
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
    return {**booking.to_json(), "guarantee_text": GUARANTEE_TEXT[booking.guarantee],
            "can_cancel": isinstance(out, Booking), "cancel_refused": out if isinstance(out, str) else None}


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
    promised: dict[str, str] = {}  # what a booking of each offer would record: the calendar promises only that
    for o in offers:
        full = local.offer(o.id) if local is not None and o.provider == "local" else None
        capacity[o.key] = full.capacity if full is not None else None
        promised[o.key] = promised_guarantee(o.provider, (full or o).reservable, capacity[o.key])
    return slots(day_start, days, reservations(ws), capacity, [o.key for o in offers], guarantees=promised)
