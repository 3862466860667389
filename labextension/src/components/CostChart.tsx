import React from 'react';

import * as fmt from '../format';
import { COST_TERMS, costBars, routeName as routeLabel, TERM_LABEL, termWords } from '../routes';
import { IRoute } from '../types';

/**
 * The routes' costs as stacked bars on one scale (the dearest route fills the width), in
 * plain SVG. Each bar's label sits above it; the figure's label reads the totals out.
 */
export function CostChart(props: { routes: IRoute[]; selected: string | null }): JSX.Element | null {
  const bars = costBars(props.routes);
  if (bars.length === 0) {
    return null;
  }
  const summary = bars
    .map(b => `${routeLabel(b.route)} ${fmt.money(b.total)}${b.route.blocked ? ' (blocked)' : ''}`)
    .join('; ');
  return (
    <figure className="jp-Portable-chart" role="img" aria-label={`Cost per route: ${summary}`}>
      {bars.map(bar => (
        <div
          key={bar.route.id}
          className={[
            'jp-Portable-bar',
            bar.route.blocked ? 'jp-mod-blocked' : '',
            bar.route.id === props.selected ? 'jp-mod-selected' : ''
          ].join(' ')}
          data-route={bar.route.id}
        >
          <div className="jp-Portable-barLabel">
            <span>{routeLabel(bar.route)}</span>
            <span>{fmt.money(bar.total)}</span>
          </div>
          <svg viewBox="0 0 100 10" preserveAspectRatio="none" width="100%" height="10" aria-hidden="true">
            {bar.segments.map(seg => (
              <rect
                key={seg.term}
                className={`jp-Portable-seg jp-Portable-seg-${seg.term}`}
                x={seg.x * 100}
                y={0}
                width={Math.max(0.4, seg.width * 100)}
                height={10}
              >
                <title>{`${TERM_LABEL[seg.term]}: ${fmt.money(seg.value)}`}</title>
              </rect>
            ))}
          </svg>
        </div>
      ))}
      <figcaption>
        <ul className="jp-Portable-legend">
          {COST_TERMS.map(t => (
            <li key={t}>
              <svg width="10" height="10" aria-hidden="true">
                <rect className={`jp-Portable-seg jp-Portable-seg-${t}`} width="10" height="10" />
              </svg>
              <span title={termWords(t)}>{TERM_LABEL[t]}</span>
            </li>
          ))}
        </ul>
      </figcaption>
    </figure>
  );
}
