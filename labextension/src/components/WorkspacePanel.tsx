import React from 'react';

import * as fmt from '../format';
import { machineName, providerName } from '../routes';
import { IMachine, IPortableState } from '../types';
import { Facts, Section, StateBadge } from './common';

/** The workspace's name, id and store. */
export function WorkspaceHeader(props: { state: IPortableState }): JSX.Element {
  const ws = props.state.workspace;
  return (
    <Section id="workspace" title="Workspace" collapsible summary={ws.name}>
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
  // the server's figure, the one `jupyter portable state` says (core/state_words.safe_version)
  return state.lifecycle.safe_version ?? Math.max(state.snapshot?.version ?? 0, state.lifecycle.version);
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

/**
 * The countdown to a job's walltime (a Slurm job: `allocation.ends_at`), counted on the page's
 * clock between fetches: "in 42 min (Mon 7 Dec 14:00); job 18 queued to take over", "ended".
 */
/**
 * The Continue panel's line while the workspace runs on a machine: "Running on <machine>", with the
 * server's "unreachable since 14:02Z" (state.unreachable, core/reachability.py) while no path reaches
 * it, and the machine alone again once it answers; null when the workspace runs on none.
 */
export function runningLine(state: IPortableState): string | null {
  if (state.lifecycle.state !== 'ACTIVE' || !state.allocation) {
    return null;
  }
  const readyNote = fmt.readyLine(state.allocation.estimate);
  return (
    `Running on ${machineName(state.allocation)}` +
    (state.unreachable
      ? `, ${state.unreachable.line}: nothing is released while its provider may still run it.`
      : readyNote
        ? `, ${readyNote}.`
        : '.')
  );
}

export function jobEndText(endsAt: string, nextJob: string | null, now: number): string {
  const end = Date.parse(endsAt);
  if (Number.isNaN(end)) {
    return endsAt;
  }
  const left = (end - now) / 1000;
  const when = left > 0 ? `in ${fmt.duration(left)} (${fmt.when(endsAt)})` : 'ended';
  return nextJob ? `${when}; job ${nextJob} queued to take over` : when;
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
          ['Provider', providerName(a.provider)],
          ['GPU', (a.gpu_count ?? 1) > 1 ? `${a.gpu} x${a.gpu_count}` : a.gpu],
          ['Driver', a.driver ?? '—'],
          ['Region', a.region ?? '—'],
          ['Price', fmt.pricePerHour(a.price_per_hour)],
          ['Spend', fmt.money(a.spend)],
          ['Uptime', fmt.duration(uptime)],
          ...(a.ends_at
            ? [['Job ends', jobEndText(a.ends_at, a.next_job ?? null, now)] as [string, React.ReactNode]]
            : []),
          ['Allocation', <code>{a.allocation_id}</code>]
        ]}
      />
    );
  }
  return (
    <Section id="allocation" title="Machine" actions={<StateBadge state={lifecycle.state} words={props.state.states?.[lifecycle.state]} />}>
      {body}
      <p className={`jp-Portable-budget jp-Portable-budget-${budget?.state ?? 'ok'}`} aria-label="spend">
        <span className="jp-Portable-spendLine">{spendText(state)}</span>
        {budget && typeof budget.cap === 'number'
          ? ` · ${budgetLeftText(budget)}`
          : ''}
        {budget && (budget.state === 'warn' || budget.state === 'exhausted' || budget.state === 'unknown') && budget.message
          ? `: ${budget.message}`
          : ''}
      </p>
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

/**
 * What is left of the budget, as the server counts it (cap - spent - committed by bookings) and
 * as `jupyter portable spend` says it: "budget $10.00, $2.77 left ($7.16 committed to bookings)".
 */
export function budgetLeftText(budget: IPortableState['budget']): string {
  if (typeof budget.cap !== 'number') {
    return '';
  }
  const committed = budget.committed ?? 0;
  const left = budget.left ?? Math.max(0, budget.cap - (budget.spent ?? 0) - committed);
  return (
    `budget ${fmt.money(budget.cap)}, ${fmt.money(left)} left` +
    (committed > 0 ? ` (${fmt.money(committed)} committed to bookings)` : '')
  );
}

/** "$0.04 so far: $0.03 on this machine, $0.01 before" (the server's words when it sends them). */
export function spendText(state: IPortableState): string {
  if (state.spend) {
    return state.spend.text;
  }
  const spent = state.budget?.spent;
  return typeof spent === 'number' ? `${fmt.money(spent)} so far` : 'Spend unknown';
}

const MACHINE_STATE: { [state: string]: string } = {
  active: 'running',
  released: 'released',
  lost: 'lost',
  failed: 'launch failed',
  refused: 'refused at admission'
};

function MachineItem(props: { m: IMachine; now: number }): JSX.Element {
  const { m } = props;
  const end = m.stopped ? fmt.when(m.stopped) : m.current ? 'now' : '—';
  return (
    <li
      className={`jp-Portable-machineItem jp-mod-${m.state}${m.current ? ' jp-mod-current' : ''}`}
      data-allocation={m.allocation_id ?? undefined}
      title={m.allocation_id ?? undefined}
    >
      <div>
        <span className="jp-Portable-machineName">{machineName(m)}</span>{' '}
        <span className="jp-Portable-tag">{m.current ? 'this machine' : (MACHINE_STATE[m.state] ?? m.state)}</span>{' '}
        <span className="jp-Portable-machineCost">{fmt.money(m.cost)}</span>
      </div>
      <div className="jp-Portable-hint">
        {fmt.when(m.started)} – {end}
        {m.price_per_hour ? ` · ${fmt.pricePerHour(m.price_per_hour)}` : ''}
      </div>
      {m.reason ? <div className="jp-Portable-machineReason">{m.reason}</div> : null}
    </li>
  );
}

/** Every machine this workspace had, newest first, from the store's allocation history. */
export function MachinesPanel(props: { state: IPortableState; now: number }): JSX.Element {
  const machines = props.state.machines ?? [];
  return (
    <Section id="machines" title="Machines" collapsible summary={`${machines.length}`}>
      {machines.length === 0 ? (
        <p className="jp-Portable-empty">No machine has served this workspace yet.</p>
      ) : (
        <ul className="jp-Portable-list" aria-label="machines, newest first">
          {machines.map((m, i) => (
            <MachineItem key={`${m.allocation_id}-${i}`} m={m} now={props.now} />
          ))}
        </ul>
      )}
    </Section>
  );
}
