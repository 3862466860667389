import React from 'react';

import { IStateWords, LifecycleState } from '../types';

const COLLAPSED_KEY = 'jupyter-portable:collapsed';

/** The sections the user folded, remembered in this browser across reloads. */
export function collapsedSections(): Set<string> {
  try {
    const raw = window.localStorage.getItem(COLLAPSED_KEY);
    const list: unknown = raw ? JSON.parse(raw) : [];
    return new Set(Array.isArray(list) ? list.filter((x): x is string => typeof x === 'string') : []);
  } catch {
    return new Set();
  }
}

function rememberCollapsed(id: string, collapsed: boolean): void {
  const set = collapsedSections();
  if (collapsed) {
    set.add(id);
  } else {
    set.delete(id);
  }
  try {
    window.localStorage.setItem(COLLAPSED_KEY, JSON.stringify([...set]));
  } catch {
    // storage full or refused: the section still folds for this session
  }
}

/**
 * A titled part of the sidebar; its heading labels it for screen readers. A section with
 * ``collapsible`` folds from its heading's button and stays folded across reloads.
 */
export function Section(props: {
  id: string;
  title: string;
  children?: React.ReactNode;
  actions?: React.ReactNode;
  collapsible?: boolean;
  summary?: React.ReactNode;
}): JSX.Element {
  const headingId = `jp-Portable-${props.id}-heading`;
  const [collapsed, setCollapsed] = React.useState(() => !!props.collapsible && collapsedSections().has(props.id));
  const toggle = () => {
    rememberCollapsed(props.id, !collapsed);
    setCollapsed(!collapsed);
  };
  return (
    <section
      className={`jp-Portable-section jp-Portable-${props.id}${collapsed ? ' jp-mod-collapsed' : ''}`}
      aria-labelledby={headingId}
    >
      <header className="jp-Portable-sectionHeader">
        <h3 id={headingId}>
          {props.collapsible ? (
            <button
              type="button"
              className="jp-Portable-fold"
              aria-expanded={!collapsed}
              aria-controls={`jp-Portable-${props.id}-body`}
              onClick={toggle}
            >
              <span aria-hidden="true">{collapsed ? '▸' : '▾'}</span> {props.title}
            </button>
          ) : (
            props.title
          )}
        </h3>
        {props.actions && !collapsed ? <div className="jp-Portable-sectionActions">{props.actions}</div> : null}
        {collapsed && props.summary ? <span className="jp-Portable-foldSummary">{props.summary}</span> : null}
      </header>
      <div id={`jp-Portable-${props.id}-body`} hidden={collapsed}>
        {props.children}
      </div>
    </section>
  );
}

/** Label/value rows. */
export function Facts(props: {
  label: string;
  rows: Array<[string, React.ReactNode]>;
}): JSX.Element {
  return (
    <dl className="jp-Portable-facts" aria-label={props.label}>
      {props.rows.map(([k, v]) => (
        <React.Fragment key={k}>
          <dt>{k}</dt>
          <dd>{v}</dd>
        </React.Fragment>
      ))}
    </dl>
  );
}

// every state's colour: a state the schema adds fails to compile until it has one
const STATE_TONE: { [K in LifecycleState]: string } = {
  ACTIVE: 'good',
  READY: 'good',
  LOST: 'bad',
  FAILED: 'bad',
  IDLE: 'neutral',
  RELEASED: 'neutral',
  SEALED: 'neutral',
  DRAINING: 'busy',
  ROUTING: 'busy',
  ACQUIRING: 'busy',
  PROBING: 'busy',
  MATERIALIZING: 'busy',
  VERIFYING: 'busy'
};

/** The lifecycle state as a coloured badge (the text says it too); ``words``: the server's
 * words for it (core/state_words.py), said on hover and to screen readers. */
export function StateBadge(props: { state: string; words?: IStateWords }): JSX.Element {
  const tone = STATE_TONE[props.state as LifecycleState] ?? 'neutral';
  const meaning = props.words ? `: ${props.words.meaning}` : '';
  return (
    <span
      className={`jp-Portable-badge jp-Portable-badge-${tone}`}
      data-state={props.state}
      data-machine={props.words ? String(props.words.machine) : undefined}
      title={props.words ? `${props.words.label}${meaning}. To do: ${props.words.action}.` : undefined}
      aria-label={`state: ${props.state}${meaning}`}
    >
      {props.state}
    </span>
  );
}

/** The outcome of the last action of a section. */
export function StatusLine(props: {
  status?: { kind: 'info' | 'error'; text: string };
}): JSX.Element | null {
  if (!props.status) {
    return null;
  }
  return (
    <p
      className={`jp-Portable-status jp-Portable-status-${props.status.kind}`}
      role={props.status.kind === 'error' ? 'alert' : 'status'}
    >
      {props.status.text}
    </p>
  );
}

/** An error from the API, with its hint. */
export function ApiErrorLine(props: {
  error: { message: string; hint: string | null } | null;
}): JSX.Element | null {
  if (!props.error) {
    return null;
  }
  return (
    <div className="jp-Portable-error" role="alert">
      <p>{props.error.message}</p>
      {props.error.hint ? <p className="jp-Portable-hint">To fix: {props.error.hint}</p> : null}
    </div>
  );
}
