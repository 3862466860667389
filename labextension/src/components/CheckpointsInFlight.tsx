import React from 'react';

import { checkpointRows, ICheckpointRow } from '../checkpoints';
import { IPortableState } from '../types';

function Row(props: { row: ICheckpointRow }): JSX.Element {
  const { row } = props;
  return (
    <li
      className={`jp-Portable-checkpoint jp-Portable-ckFlight jp-mod-${row.kind}`}
      data-key={row.key}
      title={row.title}
    >
      <span className="jp-Portable-ckMark" aria-hidden="true">
        {row.mark}
      </span>
      <span className="jp-Portable-ckLine">{row.text}</span>
      {row.percent !== null ? (
        <progress className="jp-Portable-ckBar" max={100} value={row.percent} aria-label={row.text} />
      ) : null}
      {row.where ? <span className="jp-Portable-ckWhere">{row.where}</span> : null}
    </li>
  );
}

/** Checkpoints on their way to verified, and how the last ones ended (the server's words). */
export function CheckpointsInFlight(props: { state: IPortableState }): JSX.Element | null {
  const rows = checkpointRows(props.state);
  if (rows.length === 0) {
    return null;
  }
  return (
    <ul className="jp-Portable-list jp-Portable-inFlight" aria-label="checkpoints in flight" aria-live="polite">
      {rows.map(r => (
        <Row key={r.key} row={r} />
      ))}
    </ul>
  );
}
