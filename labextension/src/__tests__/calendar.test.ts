import { describe, expect, it } from 'vitest';

import {
  bookingRequest,
  bookingVerdict,
  calendarGrid,
  gridCells,
  inSelection,
  isoUtc,
  listBookings,
  moveFocus,
  offerKeys,
  selectionBetween
} from '../calendar';
import { IBooking, IBookingCheck } from '../types';
import { calendar, H } from './fixtures';

const START = '2026-12-01T10:00:00Z';
const NOW = Date.parse('2026-12-01T10:20:00Z');

describe('the calendar grid', () => {
  const cal = calendar(START, 2, {
    'local/a100-80': {
      capacity: 2,
      edit: (i, slot) => {
        if (i === 3) {
          slot.free = 0;
          slot.taken = 2;
          slot.mine = ['res-a', 'res-b'];
        }
        if (i === 5) {
          slot.free = 0;
          slot.taken = 2;
        }
      }
    },
    'local/h100': { capacity: null }
  });

  it('has one row per day the calendar touches, 24 hours each, in UTC', () => {
    const grid = calendarGrid(cal, 'local/a100-80', NOW, 0)!;
    // 48 hours from 10:00 on the 1st end at 10:00 on the 3rd: three days.
    expect(grid.days.map(d => d.key)).toEqual(['2026-12-01', '2026-12-02', '2026-12-03']);
    expect(grid.days.every(d => d.cells.length === 24)).toBe(true);
    expect(grid.hours[0]).toBe('00:00');
    expect(grid.days[0].label).toBe('Tue 1 Dec');
  });

  it('marks hours outside the calendar, past hours, bookings, full and free hours', () => {
    const grid = calendarGrid(cal, 'local/a100-80', NOW, 0)!;
    const day = grid.days[0].cells;
    expect(day[9].state).toBe('outside'); // before the calendar's start
    expect(day[10].state).toBe('past'); // begun at 10:00, now is 10:20
    expect(day[11]).toMatchObject({ state: 'free', free: 2, start: '2026-12-01T11:00:00Z' });
    expect(day[13]).toMatchObject({ state: 'booked', bookings: ['res-a', 'res-b'] });
    expect(day[15]).toMatchObject({ state: 'full', free: 0 });
    expect(grid.days[2].cells[10].state).toBe('outside'); // the calendar ends at 10:00 on the 3rd
    expect(grid.days[2].cells[9].state).toBe('free');
  });

  it("puts rows on the user's days and labels hours in their zone", () => {
    // UTC+2: 10:00Z is 12:00 local; the first cell of a day is local midnight = 22:00Z.
    const grid = calendarGrid(cal, 'local/a100-80', NOW, 120)!;
    expect(grid.days[0].key).toBe('2026-12-01');
    expect(grid.days[0].cells[0].start).toBe('2026-11-30T22:00:00Z');
    expect(grid.days[0].cells[12]).toMatchObject({ label: '12:00', start: '2026-12-01T10:00:00Z', state: 'past' });
  });

  it('keeps cells on whole UTC hours in a zone half an hour off', () => {
    const grid = calendarGrid(cal, 'local/a100-80', NOW, 330)!; // UTC+5:30
    const cells = gridCells(grid);
    expect(cells.every(c => c.t % H === 0)).toBe(true);
    expect(grid.hours[0]).toBe('00:30');
    expect(grid.hours[23]).toBe('23:30');
  });

  it('has every hour of the window exactly once', () => {
    for (const offset of [0, 60, -300, 330, 840]) {
      const cells = gridCells(calendarGrid(cal, 'local/h100', NOW, offset)!).filter(c => c.state !== 'outside');
      expect(cells.length).toBe(48);
      expect(new Set(cells.map(c => c.t)).size).toBe(48);
    }
  });

  it('shows best-effort offers as free with unknown capacity', () => {
    const grid = calendarGrid(cal, 'local/h100', NOW, 0)!;
    expect(grid.guarantee).toBe('best-effort');
    expect(grid.days[0].cells[11]).toMatchObject({ state: 'free', free: null });
  });

  it('is null for an offer the calendar does not list; keys come sorted', () => {
    expect(calendarGrid(cal, 'aws/p5', NOW, 0)).toBeNull();
    expect(offerKeys(cal)).toEqual(['local/a100-80', 'local/h100']);
    expect(offerKeys(null)).toEqual([]);
  });

  it('reads slots of several hours', () => {
    const two = calendar(START, 1, { k: { capacity: 1 } });
    two.slot_hours = 2;
    two.offers.k.slots = [0, 1, 2, 3].map(i => ({
      start: isoUtc(Date.parse(START) + i * 2 * H),
      free: i === 1 ? 0 : 1,
      taken: i === 1 ? 1 : 0,
      mine: []
    }));
    const cells = calendarGrid(two, 'k', NOW, 0)!.days[0].cells;
    expect([cells[12].state, cells[13].state, cells[14].state]).toEqual(['full', 'full', 'free']);
    expect(cells[18].state).toBe('outside'); // only four slots given
  });
});

describe('choosing hours to book', () => {
  const at = (iso: string) => Date.parse(iso);

  it('runs from one hour to another in either direction, both included', () => {
    const a = at('2026-12-01T12:00:00Z');
    const b = at('2026-12-01T10:00:00Z');
    expect(selectionBetween(a, b)).toEqual({ start: '2026-12-01T10:00:00Z', hours: 3 });
    const s = selectionBetween(b, a);
    expect(inSelection(s, at('2026-12-01T12:00:00Z'))).toBe(true);
    expect(inSelection(s, at('2026-12-01T13:00:00Z'))).toBe(false);
    expect(inSelection(null, a)).toBe(false);
  });

});

describe('what the server says of a selection', () => {
  const request = bookingRequest('local/a100', { start: '2026-12-01T11:00:00Z', hours: 3 }, 'before')!;
  const answer = (over: Partial<IBookingCheck>): IBookingCheck => ({
    offer: 'local/a100',
    start: '2026-12-01T11:00:00Z',
    hours: 3,
    charge: 'before',
    charge_at: '2026-12-01T10:20:00Z',
    price: 4.5,
    problem: null,
    hint: null,
    ...over
  });

  it('asks nothing of the server until hours are chosen', () => {
    expect(bookingRequest('local/a100', null, 'now')).toBeNull();
    expect(bookingVerdict(null, null)).toMatchObject({ problem: 'choose a start hour on the calendar', canBook: false });
  });

  it('may be booked only once the server answered for this very selection', () => {
    expect(bookingVerdict(request, null)).toEqual({ problem: null, chargeAt: null, price: null, canBook: false });
    const ok = bookingVerdict(request, { request, answer: answer({}), error: null });
    expect(ok).toEqual({ problem: null, chargeAt: '2026-12-01T10:20:00Z', price: 4.5, canBook: true });
    // the selection moved on (one hour more, or the other charge policy): the old answer is not this one's
    const longer = { ...request, hours: 4 };
    expect(bookingVerdict(longer, { request, answer: answer({}), error: null }).canBook).toBe(false);
    const now = bookingRequest('local/a100', { start: '2026-12-01T11:00:00Z', hours: 3 }, 'now')!;
    expect(bookingVerdict(now, { request, answer: answer({}), error: null }).chargeAt).toBeNull();
  });

  it("says the server's problem in its words, with no charge time", () => {
    const full = 'cannot book local/a100 at 2026-12-01T11:00:00Z for 3 h: no capacity left for local/a100 at 2026-12-01T12:00:00Z: all 1 booked';
    const verdict = bookingVerdict(request, { request, answer: answer({ problem: full, price: null }), error: null });
    expect(verdict).toEqual({ problem: full, chargeAt: null, price: null, canBook: false });
    const over = answer({ problem: 'cannot book: over the budget', hint: 'raise the budget', price: null });
    expect(bookingVerdict(request, { request, answer: over, error: null }).problem).toBe(
      'cannot book: over the budget (raise the budget)'
    );
  });

  it('cannot be booked when the server could not be asked, and says why', () => {
    const verdict = bookingVerdict(request, { request, answer: null, error: 'cannot reach the Jupyter server' });
    expect(verdict).toMatchObject({ problem: 'cannot reach the Jupyter server', canBook: false });
  });
});

describe('listing bookings', () => {
  const booking = (over: Partial<IBooking>): IBooking => ({
    reservation_id: 'res-1',
    offer_key: 'local/a100-80',
    start: '2026-12-01T12:00:00Z',
    hours: 2,
    charge: 'before',
    guarantee: 'capacity-checked',
    guarantee_text: 'Capacity-checked: (the server\'s words)',
    price: 3.78,
    status: 'booked',
    created: '2026-12-01T09:00:00Z',
    charge_at: '2026-12-01T10:00:00Z',
    refund: null,
    ...over
  });

  it('lists active bookings by start, then cancelled ones', () => {
    const list = listBookings([
      booking({ reservation_id: 'c', status: 'cancelled' }),
      booking({ reservation_id: 'late', start: '2026-12-02T12:00:00Z' }),
      booking({ reservation_id: 'early', start: '2026-12-01T11:00:00Z' })
    ]);
    expect(list.map(b => b.reservation_id)).toEqual(['early', 'late', 'c']);
  });
});

describe('moving through the grid by keyboard', () => {
  it('moves by hour and by day and stays inside the grid', () => {
    expect(moveFocus(5, 'ArrowRight', 24, 72)).toBe(6);
    expect(moveFocus(5, 'ArrowDown', 24, 72)).toBe(29);
    expect(moveFocus(5, 'ArrowUp', 24, 72)).toBe(5);
    expect(moveFocus(0, 'ArrowLeft', 24, 72)).toBe(0);
    expect(moveFocus(30, 'Home', 24, 72)).toBe(24);
    expect(moveFocus(30, 'End', 24, 72)).toBe(47);
    expect(moveFocus(30, 'a', 24, 72)).toBeNull();
  });
});
