/**
 * The reservation calendar's logic: the days-by-hours grid of one offer's slots, the
 * selection of a run of hours, what the server's dry run of booking it says (why it cannot
 * be booked, when it would be charged: the server's rules, never a copy of them) and what
 * its guarantee means. Pure functions; time is passed in, never read.
 *
 * Rows are days in the user's zone (a fixed offset from UTC, in minutes east); cells are
 * the whole UTC hours that start in that day, because the server books on whole UTC hours
 * (a zone half an hour off UTC shows 00:30, 01:30, ...).
 */

import {
  ChargePolicy,
  Guarantee,
  IBooking,
  IBookingCheck,
  IBookingRequest,
  ICalendar,
  ICalendarOffer,
  ICalendarSlot
} from './types';

export const HOUR_MS = 3600 * 1000;
const DAY_MS = 24 * HOUR_MS;

export type CellState = 'free' | 'full' | 'booked' | 'past' | 'outside';

export interface ICell {
  /** The hour's start, ISO in UTC ("...Z"). */
  start: string;
  /** Its start in ms since the epoch. */
  t: number;
  /** "14:00" in the user's zone. */
  label: string;
  state: CellState;
  /** Capacity left; null where unknown (best-effort) or outside the calendar. */
  free: number | null;
  taken: number;
  /** Reservation ids holding this hour. */
  bookings: string[];
}

export interface IDayRow {
  /** "2026-12-01" in the user's zone. */
  key: string;
  /** "Tue 1 Dec". */
  label: string;
  cells: ICell[];
}

export interface IGrid {
  offerKey: string;
  capacity: number | null;
  guarantee: Guarantee;
  /** Column headings, one per cell of a row. */
  hours: string[];
  days: IDayRow[];
}

const WEEKDAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const MONTHS = [
  'Jan',
  'Feb',
  'Mar',
  'Apr',
  'May',
  'Jun',
  'Jul',
  'Aug',
  'Sep',
  'Oct',
  'Nov',
  'Dec'
];

function pad(n: number): string {
  return String(n).padStart(2, '0');
}

/** ms since the epoch as ISO in UTC without milliseconds, as the server writes times. */
export function isoUtc(t: number): string {
  return new Date(t).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** The offset of the browser's zone at ``t``, in minutes east of UTC. */
export function localOffsetMinutes(t: number): number {
  return -new Date(t).getTimezoneOffset();
}

function shifted(t: number, offsetMinutes: number): Date {
  return new Date(t + offsetMinutes * 60 * 1000);
}

function hourLabel(t: number, offsetMinutes: number): string {
  const d = shifted(t, offsetMinutes);
  return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}`;
}

/** The offer keys of a calendar, sorted. */
export function offerKeys(calendar: ICalendar | null): string[] {
  return calendar ? Object.keys(calendar.offers).sort() : [];
}

function slotAt(
  calendar: ICalendar,
  offer: ICalendarOffer,
  t: number
): ICalendarSlot | null {
  const start = Date.parse(calendar.start);
  const span = calendar.slot_hours * HOUR_MS;
  const index = Math.floor((t - start) / span);
  if (t < start || index >= offer.slots.length) {
    return null;
  }
  return offer.slots[index] ?? null;
}

/**
 * The days-by-hours grid for ``offerKey``: every day the calendar touches, each with 24
 * hourly cells. Null when the calendar does not list the offer.
 *
 * A cell is "past" when its hour has begun (the server refuses such starts), "booked" when
 * one of the workspace's reservations holds it, "full" when no capacity is left, "free"
 * otherwise (including best-effort hours of unknown capacity), and "outside" when the
 * calendar does not cover it.
 */
export function calendarGrid(
  calendar: ICalendar,
  offerKey: string,
  now: number,
  offsetMinutes: number
): IGrid | null {
  const offer = calendar.offers[offerKey];
  if (!offer) {
    return null;
  }
  const offsetMs = offsetMinutes * 60 * 1000;
  const start = Date.parse(calendar.start);
  const end = start + calendar.days * DAY_MS;
  // The UTC instant of local midnight of the day holding ``t``.
  const dayStart = (t: number) =>
    Math.floor((t + offsetMs) / DAY_MS) * DAY_MS - offsetMs;
  // The first whole UTC hour at or after local midnight.
  const firstHour = (midnight: number) => Math.ceil(midnight / HOUR_MS) * HOUR_MS;

  const days: IDayRow[] = [];
  for (let midnight = dayStart(start); midnight < end; midnight += DAY_MS) {
    const local = shifted(midnight, offsetMinutes);
    const cells: ICell[] = [];
    const first = firstHour(midnight);
    for (let i = 0; i < 24; i++) {
      const t = first + i * HOUR_MS;
      const slot = t >= start && t < end ? slotAt(calendar, offer, t) : null;
      let state: CellState;
      if (!slot) {
        state = 'outside';
      } else if (t < now) {
        state = 'past';
      } else if (slot.mine.length > 0) {
        state = 'booked';
      } else if (slot.free === 0) {
        state = 'full';
      } else {
        state = 'free';
      }
      cells.push({
        start: isoUtc(t),
        t,
        label: hourLabel(t, offsetMinutes),
        state,
        free: slot ? slot.free : null,
        taken: slot ? slot.taken : 0,
        bookings: slot ? [...slot.mine] : []
      });
    }
    days.push({
      key: `${local.getUTCFullYear()}-${pad(local.getUTCMonth() + 1)}-${pad(local.getUTCDate())}`,
      label: `${WEEKDAYS[local.getUTCDay()]} ${local.getUTCDate()} ${MONTHS[local.getUTCMonth()]}`,
      cells
    });
  }
  const hours = days.length ? days[0].cells.map(c => c.label) : [];
  return {
    offerKey,
    capacity: offer.capacity,
    guarantee: offer.guarantee,
    hours,
    days
  };
}

/** Every cell of the grid in time order. */
export function gridCells(grid: IGrid): ICell[] {
  return grid.days.flatMap(d => d.cells);
}

export interface ISelection {
  /** ISO start in UTC. */
  start: string;
  hours: number;
}

/** The run of whole hours from one cell to another, in either order, both included. */
export function selectionBetween(a: number, b: number): ISelection {
  const first = Math.min(a, b);
  const last = Math.max(a, b);
  return {
    start: isoUtc(first),
    hours: Math.round((last - first) / HOUR_MS) + 1
  };
}

/** Whether the cell at ``t`` lies inside ``selection``. */
export function inSelection(selection: ISelection | null, t: number): boolean {
  if (!selection) {
    return false;
  }
  const start = Date.parse(selection.start);
  return t >= start && t < start + selection.hours * HOUR_MS;
}

/** The booking request for ``selection``, or null when nothing is selected. */
export function bookingRequest(
  offerKey: string,
  selection: ISelection | null,
  charge: ChargePolicy
): IBookingRequest | null {
  return selection && offerKey ? { offer: offerKey, start: selection.start, hours: selection.hours, charge } : null;
}

function sameRequest(a: IBookingRequest, b: IBookingRequest): boolean {
  return a.offer === b.offer && a.start === b.start && a.hours === b.hours && (a.charge ?? 'before') === (b.charge ?? 'before');
}

/** The server's dry run of one request (POST reservations/check): its answer, or why it failed. */
export interface IChecked {
  request: IBookingRequest;
  answer: IBookingCheck | null;
  error: string | null;
}

/** What the Book fieldset says about the selection, and whether Book may be pressed. */
export interface IBookingVerdict {
  /**
   * Why it cannot be booked, in the server's words with its "to fix" hint; null when it can,
   * or while the server is asked.
   */
  problem: string | null;
  /** When it would be charged (the server's clock); null unless it can be booked. */
  chargeAt: string | null;
  /** Its price in dollars, as the server works it out; null when not known. */
  price: number | null;
  /** True only when the server answered for exactly this request, with no problem. */
  canBook: boolean;
}

/**
 * The verdict on ``request`` from the server's dry run ``checked``: the browser keeps no copy
 * of the booking rules (core/calendar.py can_book, charge_time, the budget), only "nothing is
 * selected yet"; an answer for another request (the selection moved on) counts as not asked.
 */
export function bookingVerdict(request: IBookingRequest | null, checked: IChecked | null): IBookingVerdict {
  if (!request) {
    return { problem: 'choose a start hour on the calendar', chargeAt: null, price: null, canBook: false };
  }
  if (!checked || !sameRequest(checked.request, request)) {
    return { problem: null, chargeAt: null, price: null, canBook: false };
  }
  if (!checked.answer) {
    return { problem: checked.error ?? 'the server did not answer', chargeAt: null, price: null, canBook: false };
  }
  const { problem, hint, charge_at, price } = checked.answer;
  if (problem) {
    return { problem: hint ? `${problem} (${hint})` : problem, chargeAt: null, price, canBook: false };
  }
  return { problem: null, chargeAt: charge_at, price, canBook: true };
}

/** Bookings to list: active ones by start, then cancelled ones, newest first. */
export function listBookings(bookings: readonly IBooking[]): IBooking[] {
  const active = bookings
    .filter(b => b.status !== 'cancelled')
    .sort((a, b) => Date.parse(a.start) - Date.parse(b.start));
  const cancelled = bookings
    .filter(b => b.status === 'cancelled')
    .sort((a, b) => Date.parse(b.start) - Date.parse(a.start));
  return [...active, ...cancelled];
}

/** Arrow-key moves on the grid: the cell index after pressing ``key``, or null. */
export function moveFocus(
  index: number,
  key: string,
  columns: number,
  count: number
): number | null {
  let next: number;
  switch (key) {
    case 'ArrowRight':
      next = index + 1;
      break;
    case 'ArrowLeft':
      next = index - 1;
      break;
    case 'ArrowDown':
      next = index + columns;
      break;
    case 'ArrowUp':
      next = index - columns;
      break;
    case 'Home':
      next = index - (index % columns);
      break;
    case 'End':
      next = index - (index % columns) + columns - 1;
      break;
    default:
      return null;
  }
  return next >= 0 && next < count ? next : index;
}
