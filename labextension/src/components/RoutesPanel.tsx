import { Button } from '@jupyterlab/ui-components';
import React, { useState } from 'react';

import { PortableApiError } from '../api';
import * as fmt from '../format';
import {
  blockReasons,
  CATEGORY_LABEL,
  checkRows,
  checksSummary,
  routeLabel,
  SortKey,
  sortRoutes
} from '../routes';
import { IRoute, IRoutesAnswer } from '../types';
import { CostChart } from './CostChart';
import { ApiErrorLine, Section } from './common';

const COLUMNS: Array<{ key: SortKey; label: string; title: string }> = [
  { key: 'price', label: '$/h', title: 'GPU price per hour' },
  { key: 'gpu', label: 'GPU', title: 'GPU: price per hour x planned hours' },
  { key: 'egress', label: 'Transfer', title: 'Egress: moving the workspace there' },
  { key: 'storage', label: 'Storage', title: 'Storage for the planned hours' },
  { key: 'queue', label: 'Queue', title: 'Expected wait, priced at the GPU rate' },
  { key: 'risk', label: 'Risk', title: 'Chance of a failed attempt x its cost' },
  { key: 'total', label: 'Total', title: 'Whole cost of getting to the next verified state' },
  { key: 'ready', label: 'Ready in', title: 'Queue + boot + transfer' }
];

const MARK = { passed: '✓', failed: '✗', 'not-done': '·' } as const;

function Checks(props: { route: IRoute }): JSX.Element {
  return (
    <span className="jp-Portable-checks" aria-label={checksSummary(props.route)} title={checksSummary(props.route)}>
      {checkRows(props.route).map(c => (
        <span key={c.name} className={`jp-Portable-check jp-mod-${c.status}`} aria-hidden="true">
          {MARK[c.status]}
        </span>
      ))}
    </span>
  );
}

function cell(route: IRoute, key: SortKey): string {
  switch (key) {
    case 'price':
      return fmt.money(route.price_per_hour);
    case 'ready':
      return fmt.duration(route.time_to_ready_s);
    case 'total':
    case 'rank':
      return fmt.money(route.cost.total);
    default:
      return fmt.money(route.cost[key]);
  }
}

/** The routes with their cost breakdown, the checks done, and why blocked ones are. */
export function RoutesPanel(props: {
  answer: IRoutesAnswer | null;
  error: PortableApiError | null;
  loading: boolean;
  selected: string | null;
  hours: number;
  disabled: boolean;
  onSelect: (id: string) => void;
  onRefresh: (hours: number) => void;
}): JSX.Element {
  const [sort, setSort] = useState<{ key: SortKey; desc: boolean }>({ key: 'rank', desc: false });
  const [hours, setHours] = useState(String(props.hours));
  const routes = props.answer ? sortRoutes(props.answer.routes, sort.key, sort.desc) : [];
  const blockedCount = routes.filter(r => r.blocked).length;

  const header = (key: SortKey, label: string, title: string) => {
    const active = sort.key === key;
    return (
      <th
        key={key}
        scope="col"
        aria-sort={active ? (sort.desc ? 'descending' : 'ascending') : 'none'}
        title={title}
      >
        <button
          type="button"
          className="jp-Portable-sort"
          onClick={() => setSort({ key, desc: active ? !sort.desc : false })}
        >
          {label}
          {active ? (sort.desc ? ' ▾' : ' ▴') : ''}
        </button>
      </th>
    );
  };

  return (
    <Section
      id="routes"
      title="Routes"
      actions={
        <form
          className="jp-Portable-row"
          onSubmit={e => {
            e.preventDefault();
            const h = Number(hours);
            if (Number.isFinite(h) && h > 0) {
              props.onRefresh(h);
            }
          }}
        >
          <label className="jp-Portable-inline">
            for
            <input
              className="jp-mod-styled jp-Portable-num"
              type="number"
              min={1}
              step={1}
              value={hours}
              aria-label="planned hours"
              onChange={e => setHours(e.target.value)}
            />
            h
          </label>
          <Button type="submit" small className="jp-mod-styled" disabled={props.loading} aria-label="price the routes again">
            {props.loading ? 'Pricing…' : 'Refresh'}
          </Button>
        </form>
      }
    >
      <ApiErrorLine error={props.error} />
      {props.answer && routes.length === 0 ? (
        <p className="jp-Portable-empty">No provider offers anything now.</p>
      ) : null}
      {routes.length ? (
        <div className="jp-Portable-tableWrap">
          <table className="jp-Portable-routeTable">
            <caption>
              Cost of each route for {props.answer?.hours ?? props.hours} h, in dollars.
              {blockedCount ? ` ${blockedCount} blocked.` : ''} Checks: ✓ done and passed, ✗ failed, · not done
              (listed, permitted, capacity now, launched).
            </caption>
            <thead>
              <tr>
                <th scope="col">
                  <span className="jp-Portable-sr">Choose</span>
                </th>
                {header('rank', 'Route', 'Provider, GPU, region; click to restore the ranking')}
                {COLUMNS.map(c => header(c.key, c.label, c.title))}
                <th scope="col">Checks</th>
              </tr>
            </thead>
            <tbody>
              {routes.map(route => {
                const reasons = blockReasons(route);
                const selected = route.id === props.selected;
                const inputId = `jp-Portable-route-${route.id}`;
                return (
                  <React.Fragment key={route.id}>
                    <tr
                      className={[
                        'jp-Portable-route',
                        route.blocked ? 'jp-mod-blocked' : '',
                        selected ? 'jp-mod-selected' : '',
                        route.id === props.answer?.best ? 'jp-mod-best' : ''
                      ].join(' ')}
                      data-route={route.id}
                    >
                      <td>
                        <input
                          type="radio"
                          name="jp-Portable-route"
                          id={inputId}
                          checked={selected}
                          disabled={route.blocked !== null || props.disabled}
                          onChange={() => props.onSelect(route.id)}
                          aria-describedby={route.blocked ? `${inputId}-why` : undefined}
                        />
                      </td>
                      <th scope="row">
                        <label htmlFor={inputId} title={(route.breakdown ?? []).join('\n')}>
                          {routeLabel(route)}
                          {route.id === props.answer?.best ? <span className="jp-Portable-best"> best</span> : null}
                        </label>
                      </th>
                      {COLUMNS.map(c => (
                        <td key={c.key} className="jp-Portable-num">
                          {cell(route, c.key)}
                        </td>
                      ))}
                      <td>
                        <Checks route={route} />
                      </td>
                    </tr>
                    {route.blocked ? (
                      <tr className="jp-Portable-blockedRow">
                        <td />
                        <td colSpan={COLUMNS.length + 2} id={`${inputId}-why`}>
                          <span className="jp-Portable-sr">Blocked: </span>
                          <ul className="jp-Portable-reasons">
                            {reasons.map(r => (
                              <li key={r.key} data-category={r.category} data-reason={r.key}>
                                <span className={`jp-Portable-tag jp-Portable-tag-${r.category}`}>
                                  {CATEGORY_LABEL[r.category]}
                                </span>{' '}
                                {r.text}
                              </li>
                            ))}
                          </ul>
                        </td>
                      </tr>
                    ) : null}
                  </React.Fragment>
                );
              })}
            </tbody>
          </table>
        </div>
      ) : null}
      {routes.length ? <CostChart routes={routes} selected={props.selected} /> : null}
    </Section>
  );
}
