import React from 'react';

import * as fmt from '../format';
import { IPortableState } from '../types';
import { Facts, Section, StateBadge } from './common';

/** The workspace's name, id and store. */
export function WorkspaceHeader(props: { state: IPortableState }): JSX.Element {
  const ws = props.state.workspace;
  return (
    <Section id="workspace" title="Workspace">
      <Facts
        label="workspace"
        rows={[
          ['Name', <span className="jp-Portable-workspaceName">{ws.name}</span>],
          ['Id', <code>{ws.id}</code>],
          ['Store', <code className="jp-Portable-store">{ws.store}</code>]
        ]}
      />
    </Section>
  );
}

/** The last published version: the store's head, which the lifecycle may not have caught up with. */
export function safeVersion(state: IPortableState): number {
  return Math.max(state.snapshot?.version ?? 0, state.lifecycle.version);
}

/** The GPU is gone: a banner that cannot be missed. */
export function LostBanner(props: { state: IPortableState }): JSX.Element | null {
  const lost = props.state.lost;
  if (!lost) {
    return null;
  }
  return (
    <div className="jp-Portable-lost" role="alert" aria-live="assertive">
      <strong>GPU lost</strong>
      <span className="jp-Portable-lostReason">{lost.reason}</span>
      {lost.at ? <span className="jp-Portable-lostAt">at {fmt.when(lost.at)}</span> : null}
      <span>
        The workspace is safe at version {safeVersion(props.state)}. Choose a route below and press
        Continue.
      </span>
    </div>
  );
}

/** The machine serving the workspace now. */
export function AllocationPanel(props: {
  state: IPortableState;
  now: number;
  fetchedAt: number;
}): JSX.Element {
  const { state, now, fetchedAt } = props;
  const a = state.allocation;
  const lifecycle = state.lifecycle;
  const budget = state.budget;
  let body: React.ReactNode;
  if (!a) {
    body = <p className="jp-Portable-empty">No machine serves this workspace now.</p>;
  } else {
    // uptime_s was measured at the fetch; it keeps running until the next one.
    const uptime =
      a.uptime_s === null || lifecycle.state === 'LOST'
        ? a.uptime_s
        : a.uptime_s + Math.max(0, (now - fetchedAt) / 1000);
    body = (
      <Facts
        label="allocation"
        rows={[
          ['Provider', a.provider],
          ['GPU', (a.gpu_count ?? 1) > 1 ? `${a.gpu} x${a.gpu_count}` : a.gpu],
          ['Driver', a.driver ?? '—'],
          ['Region', a.region ?? '—'],
          ['Price', fmt.pricePerHour(a.price_per_hour)],
          ['Spend', fmt.money(a.spend)],
          ['Uptime', fmt.duration(uptime)],
          ['Allocation', <code>{a.allocation_id}</code>]
        ]}
      />
    );
  }
  return (
    <Section id="allocation" title="Machine" actions={<StateBadge state={lifecycle.state} />}>
      {body}
      {budget ? (
        <p className={`jp-Portable-budget jp-Portable-budget-${budget.state}`}>
          Spent {fmt.money(budget.spent)}
          {typeof budget.cap === 'number' ? ` of ${fmt.money(budget.cap)} budget` : ''} ({budget.state})
          {budget.message ? `: ${budget.message}` : ''}
        </p>
      ) : null}
      {state.conflicts.length ? (
        <ul className="jp-Portable-conflicts" aria-label="edit conflicts">
          {state.conflicts.map(c => (
            <li key={`${c.path}-${c.at}`}>
              {c.path}: both sides changed; yours is kept as <code>{c.kept}</code>
            </li>
          ))}
        </ul>
      ) : null}
    </Section>
  );
}
