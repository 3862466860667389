import React, { useState } from 'react';

import { PortableApiError, PortableClient } from '../api';
import { PortableModel } from '../model';
import { IOrphanMachine, IOrphans } from '../types';
import { ApiErrorLine } from './common';

/** One orphan's line: which provider and machine, whose allocation, how long up, what it cost. */
export function orphanText(m: IOrphanMachine): string {
  let up = '';
  if (m.uptime_s !== null) {
    const minutes = Math.floor(m.uptime_s / 60);
    up = `, up ${Math.floor(minutes / 60)}h${String(minutes % 60).padStart(2, '0')}m`;
  }
  const estimated = m.spend_source === 'estimate' ? ' (estimated)' : '';
  const spent = m.spend === null ? '' : `, $${m.spend.toFixed(2)} so far${estimated}`;
  const whose = `allocation ${m.allocation_id ?? '?'}, workspace ${m.workspace_id ?? '?'}`;
  return `${m.provider} ${m.ref} (${whose}): ${m.state}${up}${spent}`;
}

/**
 * The orphans the server's sweep found (machines that no known workspace uses), each with
 * Terminate; the server terminates it, asks its provider, and sweeps again.
 */
export function OrphansPanel(props: { model: PortableModel }): JSX.Element | null {
  const { model } = props;
  const [busy, setBusy] = useState<string | null>(null);
  const [error, setError] = useState<PortableApiError | null>(null);
  const orphans: IOrphans | null | undefined = model.state?.orphans;
  if (!orphans || (orphans.machines.length === 0 && orphans.problems.length === 0)) {
    return null;
  }
  const terminate = async (m: IOrphanMachine): Promise<void> => {
    const target = `${m.provider}/${m.ref}`;
    setBusy(target);
    setError(null);
    try {
      await new PortableClient().terminateOrphan(target);
      await model.refreshState();
    } catch (e) {
      setError(e instanceof PortableApiError ? e : new PortableApiError(String(e), null, null, 'orphans'));
    } finally {
      setBusy(null);
    }
  };
  return (
    <section className="jp-Portable-orphans" aria-label="Machines no workspace uses">
      <h3>Machines no workspace uses</h3>
      {orphans.machines.length ? (
        <ul>
          {orphans.machines.map(m => (
            <li key={`${m.provider}/${m.ref}`} className="jp-Portable-orphan">
              <span title={m.why}>{orphanText(m)}</span>{' '}
              <button
                className="jp-Button jp-mod-styled jp-mod-warn"
                disabled={busy !== null}
                onClick={() => void terminate(m)}
              >
                {busy === `${m.provider}/${m.ref}` ? 'Terminating…' : 'Terminate'}
              </button>
            </li>
          ))}
        </ul>
      ) : null}
      {orphans.problems.map(p => (
        <p key={p} className="jp-Portable-orphansProblem" role="status">
          Could not list: {p}
        </p>
      ))}
      {error ? <ApiErrorLine error={error} /> : null}
    </section>
  );
}
