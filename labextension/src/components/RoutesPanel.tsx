import { Button } from '@jupyterlab/ui-components';
import React, { useEffect, useRef, useState } from 'react';

import { PortableApiError } from '../api';
import * as fmt from '../format';
import {
  blockReasons,
  CATEGORY_LABEL,
  checkRows,
  checksInWords,
  checksSummary,
  COST_TERMS,
  lossInWords,
  riskInWords,
  routeName,
  SortKey,
  sortRoutes,
  TERM_LABEL,
  termWords
} from '../routes';
import { IRoute, IRoutesAnswer } from '../types';
import { CostChart } from './CostChart';
import { ApiErrorLine, Section } from './common';

const COLUMNS: Array<{ key: SortKey; label: string; title: string }> = [
  { key: 'price', label: '$/h', title: 'GPU price per hour' },
  { key: 'gpu', label: 'GPU', title: termWords('gpu') },
  { key: 'egress', label: 'Transfer', title: termWords('egress') },
  { key: 'storage', label: 'Storage', title: termWords('storage') },
  { key: 'queue', label: 'Queue', title: termWords('queue') },
  { key: 'risk', label: 'Risk', title: termWords('risk') },
  { key: 'total', label: 'Total', title: termWords('total') },
  { key: 'ready', label: 'Ready in', title: 'Queue + boot + transfer' }
];

/** Under this width (px) the routes are cards, not a table. */
export const CARD_WIDTH = 400;

/** The element's width, kept up to date. */
function useWidth(): [React.RefObject<HTMLDivElement>, number] {
  const ref = useRef<HTMLDivElement>(null);
  const [width, setWidth] = useState(0);
  useEffect(() => {
    const node = ref.current;
    if (!node || typeof ResizeObserver === 'undefined') {
      return;
    }
    const observer = new ResizeObserver(entries => setWidth(entries[0]?.contentRect.width ?? 0));
    observer.observe(node);
    setWidth(node.getBoundingClientRect().width);
    return () => observer.disconnect();
  }, []);
  return [ref, width];
}

function BlockReasons(props: { route: IRoute; id: string }): JSX.Element {
  return (
    <ul className="jp-Portable-reasons" id={props.id}>
      {blockReasons(props.route).map(r => (
        <li key={r.key} data-category={r.category} data-reason={r.key}>
          <span className={`jp-Portable-tag jp-Portable-tag-${r.category}`}>{CATEGORY_LABEL[r.category]}</span> {r.text}
        </li>
      ))}
    </ul>
  );
}

/** Why a cheaper route is not the best one (its offer was preempted repeatedly). */
function NotBest(props: { route: IRoute }): JSX.Element {
  return (
    <p className="jp-Portable-demoted" data-demoted="yes">
      {props.route.demoted}
    </p>
  );
}

/** One route as a card: its name, total and time to Ready, a one-line breakdown, the checks and risk in words. */
function RouteCard(props: {
  route: IRoute;
  hours: number | null;
  best: boolean;
  selected: boolean;
  disabled: boolean;
  onSelect: (id: string) => void;
}): JSX.Element {
  const { route } = props;
  const inputId = `jp-Portable-card-${route.id}`;
  const c = route.cost;
  return (
    <li
      className={[
        'jp-Portable-routeCard',
        route.blocked ? 'jp-mod-blocked' : '',
        props.selected ? 'jp-mod-selected' : '',
        props.best ? 'jp-mod-best' : ''
      ].join(' ')}
      data-route={route.id}
    >
      <div className="jp-Portable-cardHead">
        <input
          type="radio"
          name="jp-Portable-route"
          id={inputId}
          checked={props.selected}
          disabled={route.blocked !== null || props.disabled}
          onChange={() => props.onSelect(route.id)}
          aria-describedby={route.blocked ? `${inputId}-why` : undefined}
        />
        <label htmlFor={inputId} className="jp-Portable-cardName">
          {routeName(route)}
          {props.best ? <span className="jp-Portable-best"> best</span> : null}
        </label>
      </div>
      <div className="jp-Portable-cardFigures">
        <span className="jp-Portable-cardTotal" title={termWords('total', route)}>
          {fmt.money(c.total)}
        </span>
        <span className="jp-Portable-cardReady">ready in ~{fmt.duration(route.time_to_ready_s)}</span>
      </div>
      <p className="jp-Portable-cardBreakdown">
        GPU {fmt.money(c.gpu)} · transfer {fmt.money(c.egress)} · storage {fmt.money(c.storage)} · queue{' '}
        {fmt.money(c.queue)} · risk {fmt.money(c.risk)}
      </p>
      <p
        className="jp-Portable-cardRisk"
        data-history={route.history?.length ? 'yes' : 'no'}
        title={lossInWords(route, fmt.duration) ?? undefined}
      >
        Risk: {riskInWords(route, fmt.money, props.hours)}
      </p>
      {route.demoted ? <NotBest route={route} /> : null}
      {route.words?.unattended ? (
        // a provider whose machines cannot stop themselves: said before renting (core/guardian)
        <p className="jp-Portable-cardUnattended">{route.words.unattended}</p>
      ) : null}
      <p className="jp-Portable-cardChecks">Checks: {checksInWords(route)}</p>
      {route.blocked ? <BlockReasons route={route} id={`${inputId}-why`} /> : null}
    </li>
  );
}

/** What each part of a route's cost means, in the selected route's own numbers. */
function CostWords(props: { route: IRoute | null }): JSX.Element {
  return (
    <details className="jp-Portable-costWords">
      <summary>What the costs mean</summary>
      <dl>
        {([...COST_TERMS, 'total'] as const).map(t => (
          <React.Fragment key={t}>
            <dt>
              {t !== 'total' ? (
                <svg width="10" height="10" aria-hidden="true">
                  <rect className={`jp-Portable-seg jp-Portable-seg-${t}`} width="10" height="10" />
                </svg>
              ) : null}{' '}
              {TERM_LABEL[t]}
            </dt>
            <dd>{termWords(t, props.route)}</dd>
          </React.Fragment>
        ))}
      </dl>
    </details>
  );
}

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
  const [wrapRef, width] = useWidth();
  const narrow = width > 0 && width < CARD_WIDTH;
  const chosen = routes.find(r => r.id === props.selected) ?? routes[0] ?? null;

  const header = (key: SortKey, label: string, title: string) => {
    const active = sort.key === key;
    return (
      <th
        key={key}
        scope="col"
        data-column={key}
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
      collapsible
      summary={`${routes.length} routes`}
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
              min={0.1}
              step="any"
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
      <div ref={wrapRef} className="jp-Portable-routesBody">
      {routes.length && narrow ? (
        <>
          <p className="jp-Portable-hint">
            Cost of each route for {props.answer?.hours ?? props.hours} h.{blockedCount ? ` ${blockedCount} blocked.` : ''}
          </p>
          <ul className="jp-Portable-routeCards" aria-label="routes">
            {routes.map(route => (
              <RouteCard
                key={route.id}
                route={route}
                hours={props.answer?.hours ?? props.hours}
                best={route.id === props.answer?.best}
                selected={route.id === props.selected}
                disabled={props.disabled}
                onSelect={props.onSelect}
              />
            ))}
          </ul>
        </>
      ) : null}
      {routes.length && !narrow ? (
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
                          {routeName(route)}
                          {route.id === props.answer?.best ? <span className="jp-Portable-best"> best</span> : null}
                        </label>
                      </th>
                      {COLUMNS.map(c => (
                        <td
                          key={c.key}
                          data-column={c.key}
                          className="jp-Portable-num"
                          title={c.key === 'risk' ? riskInWords(route, fmt.money, props.answer?.hours ?? props.hours) : undefined}
                        >
                          {cell(route, c.key)}
                        </td>
                      ))}
                      <td>
                        <Checks route={route} /> <span className="jp-Portable-checkWords">{checksInWords(route)}</span>
                      </td>
                    </tr>
                    {route.history?.length || route.demoted ? (
                      <tr className="jp-Portable-historyRow">
                        <td />
                        <td colSpan={COLUMNS.length + 2} title={lossInWords(route, fmt.duration) ?? undefined}>
                          <span className="jp-Portable-cardRisk">
                            Risk: {riskInWords(route, fmt.money, props.answer?.hours ?? props.hours)}
                          </span>
                          {route.demoted ? <NotBest route={route} /> : null}
                        </td>
                      </tr>
                    ) : null}
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
      </div>
      {routes.length ? <CostWords route={chosen} /> : null}
      {routes.length ? (
        <details className="jp-Portable-chartFold" open={!narrow}>
          <summary>Cost chart</summary>
          <CostChart routes={routes} selected={props.selected} />
        </details>
      ) : null}
    </Section>
  );
}
