import { Button } from '@jupyterlab/ui-components';
import React, { useEffect, useRef, useState } from 'react';

import { PortableApiError } from '../api';
import {
  bookingRequest,
  bookingVerdict,
  calendarGrid,
  IChecked,
  gridCells,
  ICell,
  inSelection,
  ISelection,
  listBookings,
  localOffsetMinutes,
  moveFocus,
  offerKeys,
  selectionBetween
} from '../calendar';
import * as fmt from '../format';
import { IStatus } from '../model';
import { offerName } from '../routes';
import {
  CHARGE_LEAD_HOURS,
  ChargePolicy,
  IBookingCheck,
  IBookingRequest,
  IBudget,
  IReservationsAnswer,
  IRoutesAnswer
} from '../types';
import { ApiErrorLine, Section, StatusLine } from './common';

const STATE_WORD = {
  free: 'free',
  full: 'fully booked',
  booked: 'booked by you',
  past: 'past',
  outside: 'not in the calendar'
} as const;

function cellLabel(dayLabel: string, c: ICell, selected: boolean): string {
  const free = c.state === 'free' && c.free !== null ? ` (${c.free} left)` : '';
  return `${dayLabel} ${c.label}: ${STATE_WORD[c.state]}${free}${selected ? ', selected' : ''}`;
}

/** How long the selection rests before the server is asked about it. */
const CHECK_DELAY_MS = 250;
/** A selection that stands is asked about again this often (its start may pass meanwhile). */
const RECHECK_MS = 60 * 1000;

const AT_START =
  'When the slot begins, Continue starts on the booked machine (acquiring starts ahead of it where nothing is held).';

/** The calendar of free and taken slots per offer type; book and cancel. */
export function ReservationsPanel(props: {
  answer: IReservationsAnswer | null;
  error: PortableApiError | null;
  routes: IRoutesAnswer | null;
  now: number;
  /** The state's budget: when it changes (a setting, a booking elsewhere) the server is asked again. */
  budget: IBudget | null;
  /** Counts the workspace's settings changes: each one asks the server again. */
  settingsSeen?: number;
  busy: { book: boolean; cancel: boolean };
  status: { book?: IStatus; cancel?: IStatus };
  onBook: (request: IBookingRequest) => Promise<boolean>;
  /** The server's dry run of a booking: its problem, charge time and price. */
  onCheck: (request: IBookingRequest) => Promise<IBookingCheck>;
  onCancel: (id: string, what: string) => void;
}): JSX.Element {
  const keys = offerKeys(props.answer?.calendar ?? null);
  const [offer, setOffer] = useState<string>('');
  const [anchor, setAnchor] = useState<number | null>(null);
  const [selection, setSelection] = useState<ISelection | null>(null);
  const [focus, setFocus] = useState(0);
  const [charge, setCharge] = useState<ChargePolicy>('before');
  const [checked, setChecked] = useState<IChecked | null>(null);
  const gridRef = useRef<HTMLTableElement>(null);
  const focusOnRender = useRef(false);

  const offerKey = keys.includes(offer) ? offer : (keys[0] ?? '');
  const calendar = props.answer?.calendar ?? null;
  const grid = calendar && offerKey ? calendarGrid(calendar, offerKey, props.now, localOffsetMinutes(props.now)) : null;
  const cells = grid ? gridCells(grid) : [];
  const columns = grid?.hours.length ?? 24;
  const request = grid ? bookingRequest(offerKey, selection, charge) : null;
  const verdict = bookingVerdict(request, checked);
  const problem = grid ? verdict.problem : 'no calendar';
  const requestKey = request ? JSON.stringify(request) : '';
  const { onCheck } = props;
  const budgetKey = JSON.stringify(props.budget);
  const tick = Math.floor(props.now / RECHECK_MS);

  // The server says whether the selection can be booked, and when it would be charged, by the
  // booking's own rules and clock; asked again once the selection rests, when the bookings, the
  // budget or the settings change, and every minute.
  useEffect(() => {
    if (!request) {
      return;
    }
    let current = true;
    const timer = setTimeout(() => {
      onCheck(request).then(
        answer => current && setChecked({ request, answer, error: null }),
        (error: unknown) =>
          current &&
          setChecked({ request, answer: null, error: error instanceof PortableApiError ? error.full : String(error) })
      );
    }, CHECK_DELAY_MS);
    return () => {
      current = false;
      clearTimeout(timer);
    };
  }, [requestKey, props.answer, budgetKey, props.settingsSeen, tick, onCheck]);

  useEffect(() => {
    if (focusOnRender.current) {
      focusOnRender.current = false;
      gridRef.current?.querySelector<HTMLElement>('[tabindex="0"]')?.focus();
    }
  });

  const choose = (index: number, extend: boolean) => {
    const c = cells[index];
    if (!c || c.state === 'outside' || c.state === 'past') {
      return;
    }
    if (extend && anchor !== null) {
      setSelection(selectionBetween(anchor, c.t));
    } else {
      setAnchor(c.t);
      setSelection(selectionBetween(c.t, c.t));
    }
    setFocus(index);
  };

  const onKeyDown = (e: React.KeyboardEvent) => {
    if (e.key === 'Enter' || e.key === ' ') {
      e.preventDefault();
      choose(focus, e.shiftKey);
      return;
    }
    const next = moveFocus(focus, e.key, columns, cells.length);
    if (next === null) {
      return;
    }
    e.preventDefault();
    focusOnRender.current = true;
    if (e.shiftKey) {
      choose(next, true);
    } else {
      setFocus(next);
    }
  };

  const book = async () => {
    if (!selection || !offerKey) {
      return;
    }
    const ok = await props.onBook({ offer: offerKey, start: selection.start, hours: selection.hours, charge });
    if (ok) {
      setSelection(null);
      setAnchor(null);
    }
  };

  const bookings = listBookings(props.answer?.reservations ?? []);

  return (
    <Section id="reservations" title="Reservations" collapsible summary={`${bookings.filter(b => b.status !== 'cancelled').length} booked`}>
      <ApiErrorLine error={props.error} />
      {props.answer && keys.length === 0 ? <p className="jp-Portable-empty">No offer can be reserved.</p> : null}
      {keys.length ? (
        <label className="jp-Portable-inline">
          Offer
          <select
            className="jp-mod-styled"
            value={offerKey}
            aria-label="offer type"
            onChange={e => {
              setOffer(e.target.value);
              setSelection(null);
              setAnchor(null);
            }}
          >
            {keys.map(k => (
              <option key={k} value={k}>
                {offerName(k, props.routes?.routes)}
              </option>
            ))}
          </select>
        </label>
      ) : null}
      {grid ? (
        <>
          <p className="jp-Portable-guarantee" data-guarantee={grid.guarantee}>
            {/* the server's words: the calendar promises what a booking records */}
            {props.answer?.calendar?.offers[grid.offerKey]?.guarantee_text}
            {grid.capacity !== null ? ` Capacity: ${grid.capacity} at a time.` : ''}
          </p>
          <div className="jp-Portable-tableWrap">
            <table
              className="jp-Portable-calendar"
              role="grid"
              ref={gridRef}
              aria-label={`Reservation calendar for ${offerName(grid.offerKey, props.routes?.routes)}, in ${fmt.zone()}: days by hours. Arrow keys move, Enter chooses a start, Shift extends.`}
              onKeyDown={onKeyDown}
            >
              <thead>
                <tr>
                  <th scope="col" title={`Times in ${fmt.zone()}`}>
                    {fmt.zone()}
                  </th>
                  {grid.hours.map((h, i) => (
                    <th key={h} scope="col" aria-label={h}>
                      {i % 6 === 0 ? h.slice(0, 2) : ''}
                    </th>
                  ))}
                </tr>
              </thead>
              <tbody>
                {grid.days.map((day, d) => (
                  <tr key={day.key}>
                    <th scope="row">{day.label}</th>
                    {day.cells.map((c, h) => {
                      const index = d * columns + h;
                      const selected = inSelection(selection, c.t);
                      return (
                        <td
                          key={c.start}
                          role="gridcell"
                          tabIndex={index === focus ? 0 : -1}
                          aria-selected={selected}
                          aria-disabled={c.state === 'past' || c.state === 'outside'}
                          aria-label={cellLabel(day.label, c, selected)}
                          title={cellLabel(day.label, c, selected)}
                          className={`jp-Portable-slot jp-mod-${c.state}${selected ? ' jp-mod-chosen' : ''}`}
                          data-start={c.start}
                          onClick={e => choose(index, e.shiftKey)}
                          onFocus={() => setFocus(index)}
                        />
                      );
                    })}
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
          <ul className="jp-Portable-legend">
            {(['free', 'full', 'booked', 'past'] as const).map(s => (
              <li key={s}>
                <span className={`jp-Portable-swatch jp-Portable-slot jp-mod-${s}`} aria-hidden="true" />
                {STATE_WORD[s]}
              </li>
            ))}
          </ul>
          <fieldset className="jp-Portable-booking">
            <legend>Book</legend>
            <p role="status">
              {selection
                ? `${fmt.span(selection.start, selection.hours)}, ${selection.hours} h${verdict.price !== null ? `, ${fmt.money(verdict.price)}` : ''}`
                : 'Choose a start hour (Shift to extend).'}
            </p>
            <div role="radiogroup" aria-label="charge policy" className="jp-Portable-row">
              <label>
                <input type="radio" name="jp-Portable-charge" checked={charge === 'now'} onChange={() => setCharge('now')} />
                charge now
              </label>
              <label>
                <input
                  type="radio"
                  name="jp-Portable-charge"
                  checked={charge === 'before'}
                  onChange={() => setCharge('before')}
                />
                charge {CHARGE_LEAD_HOURS} h before start
              </label>
            </div>
            {selection && verdict.chargeAt ? (
              <p className="jp-Portable-hint">
                Charged {fmt.when(verdict.chargeAt)}. {AT_START}
              </p>
            ) : null}
            {selection && problem ? <p className="jp-Portable-hint">{problem}</p> : null}
            <Button
              className="jp-mod-styled jp-mod-accept"
              disabled={!verdict.canBook || props.busy.book}
              onClick={() => void book()}
            >
              {props.busy.book ? 'Booking…' : 'Book'}
            </Button>
          </fieldset>
        </>
      ) : null}
      <StatusLine status={props.status.book} />
      {bookings.length ? (
        <ul className="jp-Portable-list jp-Portable-bookings" aria-label="your reservations">
          {bookings.map(b => (
            <li key={b.reservation_id} className={`jp-Portable-bookingItem jp-mod-${b.status}`} data-reservation={b.reservation_id}>
              <div>
                <strong>{offerName(b.offer_key, props.routes?.routes)}</strong>{' '}
                <code className="jp-Portable-offerKey">{b.offer_key}</code>{' '}
                {fmt.span(b.start, b.hours)}, {b.hours} h, {fmt.money(b.price)}{' '}
                <span className="jp-Portable-tag">{b.status}</span>
              </div>
              <div className="jp-Portable-hint">
                {b.guarantee_text}{' '}
                {b.status === 'cancelled'
                  ? b.refund
                    ? `Refunded ${fmt.money(b.refund)}.`
                    : 'Nothing was charged.'
                  : `Charged ${b.charge === 'now' ? 'at booking' : `${CHARGE_LEAD_HOURS} h before start`}: ${fmt.when(b.charge_at)}. ${AT_START}`}
              </div>
              {b.can_cancel ? (
                <Button
                  small
                  className="jp-mod-styled jp-mod-warn"
                  disabled={props.busy.cancel}
                  onClick={() =>
                    props.onCancel(
                      b.reservation_id,
                      `${offerName(b.offer_key, props.routes?.routes)}, ${fmt.span(b.start, b.hours)}, ${fmt.money(b.price)}`
                    )
                  }
                  aria-label={`Cancel reservation ${b.reservation_id}`}
                >
                  Cancel
                </Button>
              ) : null}
            </li>
          ))}
        </ul>
      ) : null}
      <StatusLine status={props.status.cancel} />
    </Section>
  );
}
