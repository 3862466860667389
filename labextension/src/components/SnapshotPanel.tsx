import { Button } from '@jupyterlab/ui-components';
import React, { useState } from 'react';

import * as fmt from '../format';
import { IStatus } from '../model';
import { IProgressEvent } from '../events';
import { ICheckpoint, IPortableState } from '../types';
import { CheckpointsInFlight } from './CheckpointsInFlight';
import { Facts, Section, StatusLine } from './common';

/** The last snapshot, and a button to take one. */
export function SnapshotPanel(props: {
  state: IPortableState;
  now: number;
  busy: boolean;
  status?: IStatus;
  progress: IProgressEvent | null;
  onSnapshot: (message: string) => void;
}): JSX.Element {
  const [message, setMessage] = useState('');
  const s = props.state.snapshot;
  const canSnapshot = props.state.allocation !== null && !props.state.lost;
  return (
    <Section id="snapshot" title="Last snapshot">
      {s ? (
        <Facts
          label="last snapshot"
          rows={[
            ['Version', String(s.version)],
            ['Age', fmt.age(s.created, props.now)],
            ['Size', `${fmt.bytes(s.bytes)} in ${s.files} files`],
            ['Message', s.message || '—']
          ]}
        />
      ) : (
        <p className="jp-Portable-empty">No snapshot yet.</p>
      )}
      <form
        className="jp-Portable-row"
        onSubmit={e => {
          e.preventDefault();
          props.onSnapshot(message);
          setMessage('');
        }}
      >
        <input
          className="jp-mod-styled jp-Portable-grow"
          type="text"
          value={message}
          placeholder="message (optional)"
          aria-label="snapshot message"
          onChange={e => setMessage(e.target.value)}
        />
        <Button
          type="submit"
          className="jp-mod-styled jp-mod-accept"
          disabled={props.busy || !canSnapshot}
          title={canSnapshot ? 'Publish a new verified version of the workspace' : 'No machine to snapshot from'}
        >
          {props.busy ? 'Snapshotting…' : 'Snapshot'}
        </Button>
      </form>
      {props.progress && props.busy ? (
        <p className="jp-Portable-status" role="status">
          {props.progress.message}
          {props.progress.total ? ` (${props.progress.done ?? 0}/${props.progress.total})` : ''}
        </p>
      ) : null}
      <StatusLine status={props.status} />
    </Section>
  );
}

function CheckpointItem(props: { ck: ICheckpoint; now: number }): JSX.Element {
  const { ck, now } = props;
  return (
    <li className={`jp-Portable-checkpoint ${ck.verified ? 'jp-mod-verified' : 'jp-mod-rejected'}`}>
      <span className="jp-Portable-ckMark" aria-hidden="true">
        {ck.verified ? '✓' : '✗'}
      </span>
      <span className="jp-Portable-ckPath">{ck.path}</span>
      {ck.step !== null ? <span className="jp-Portable-ckStep">step {ck.step}</span> : null}
      {ck.verified ? (
        <>
          {ck.note ? <span className="jp-Portable-ckNote">{ck.note}</span> : null}
          <span className="jp-Portable-ckAge">{fmt.age(ck.created, now)}</span>
        </>
      ) : (
        <span className="jp-Portable-ckReason">{ck.reason ?? 'rejected'}</span>
      )}
    </li>
  );
}

/**
 * Checkpoints in flight and how the last ones ended (phase, percent, rate; verified or why not),
 * then the verified ones (step, note, age) and the rejected ones (reason).
 */
export function CheckpointsPanel(props: { state: IPortableState; now: number }): JSX.Element {
  const verified = props.state.checkpoints.filter(c => c.verified);
  const rejected = props.state.checkpoints.filter(c => !c.verified);
  const flying = props.state.checkpoints_in_flight ?? [];
  return (
    <Section id="checkpoints" title="Checkpoints">
      <CheckpointsInFlight state={props.state} />
      {props.state.checkpoints.length === 0 && flying.length === 0 ? (
        <p className="jp-Portable-empty">
          None registered. In a notebook: <code>%workspace checkpoint PATH --step N</code>
        </p>
      ) : null}
      {verified.length ? (
        <ul className="jp-Portable-list" aria-label="verified checkpoints">
          {verified.map(c => (
            <CheckpointItem key={`${c.path}-${c.version}-${c.hash}`} ck={c} now={props.now} />
          ))}
        </ul>
      ) : null}
      {rejected.length ? (
        <ul className="jp-Portable-list" aria-label="rejected checkpoints">
          {rejected.map(c => (
            <CheckpointItem key={`${c.path}-${c.created}-${c.reason}`} ck={c} now={props.now} />
          ))}
        </ul>
      ) : null}
    </Section>
  );
}
